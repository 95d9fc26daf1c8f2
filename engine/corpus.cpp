#include "engine/corpus.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/errors.h"

namespace tmx {

namespace {

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::string_view trim(std::string_view s) {
    size_t a = 0, b = s.size();
    while (a < b && is_space(s[a])) ++a;
    while (b > a && is_space(s[b - 1])) --b;
    return s.substr(a, b - a);
}

bool is_blank(std::string_view s) {
    return trim(s).empty();
}

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Length of the valid UTF-8 sequence at the start of `s`, or 0 when it is not one.
size_t utf8_sequence_length(const unsigned char* s, size_t n) {
    const unsigned char c = s[0];
    if (c < 0x80) return 1;
    auto cont = [&](size_t i, unsigned char lo = 0x80, unsigned char hi = 0xBF) {
        return i < n && s[i] >= lo && s[i] <= hi;
    };
    if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
    if (c == 0xE0) return cont(1, 0xA0) && cont(2) ? 3 : 0;
    if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return cont(1) && cont(2) ? 3 : 0;
    if (c == 0xED) return cont(1, 0x80, 0x9F) && cont(2) ? 3 : 0;
    if (c == 0xF0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
    if (c >= 0xF1 && c <= 0xF3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
    if (c == 0xF4) return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : 0;
    return 0;
}

}  // namespace

CorpusFormat parse_corpus_format(std::string_view name) {
    if (name == "auto") return CorpusFormat::Auto;
    if (name == "tinystories") return CorpusFormat::TinyStories;
    if (name == "paragraphs") return CorpusFormat::Paragraphs;
    if (name == "jsonl") return CorpusFormat::Jsonl;
    throw UsageError("--format: expected auto, tinystories, paragraphs or jsonl, got '" +
                     std::string(name) + "'");
}

const char* to_string(CorpusFormat format) {
    switch (format) {
        case CorpusFormat::Auto:
            return "auto";
        case CorpusFormat::TinyStories:
            return "tinystories";
        case CorpusFormat::Paragraphs:
            return "paragraphs";
        case CorpusFormat::Jsonl:
            return "jsonl";
    }
    return "?";
}

CorpusFormat detect_corpus_format(std::string_view head, std::string_view path) {
    if (ends_with(path, ".jsonl") || ends_with(path, ".JSONL")) return CorpusFormat::Jsonl;
    head = head.substr(0, kFormatDetectBytes);
    bool first_nonblank = true;
    size_t pos = 0;
    while (pos < head.size()) {
        size_t end = head.find('\n', pos);
        if (end == std::string_view::npos) end = head.size();
        std::string_view line = trim(head.substr(pos, end - pos));
        if (!line.empty()) {
            if (first_nonblank && line.front() == '{') return CorpusFormat::Jsonl;
            first_nonblank = false;
            if (line == kEndOfTextLine) return CorpusFormat::TinyStories;
        }
        pos = end + 1;
    }
    return CorpusFormat::Paragraphs;
}

size_t utf8_char_length(std::string_view text) {
    if (text.empty()) return 0;
    return utf8_sequence_length(reinterpret_cast<const unsigned char*>(text.data()), text.size());
}

bool is_valid_utf8(std::string_view text) {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    size_t i = 0;
    while (i < n) {
        // ASCII fast path, 8 bytes at a time.
        if (i + 8 <= n) {
            uint64_t w;
            std::memcpy(&w, s + i, 8);
            if ((w & 0x8080808080808080ull) == 0) {
                i += 8;
                continue;
            }
        }
        size_t len = utf8_sequence_length(s + i, n - i);
        if (len == 0) return false;
        i += len;
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// DocumentSplitter

DocumentSplitter::DocumentSplitter(CorpusFormat format, std::string name)
    : format_(format), name_(std::move(name)) {
    if (format_ == CorpusFormat::Auto)
        throw Error(name_ + ": internal error: DocumentSplitter needs a concrete format");
}

void DocumentSplitter::feed(std::string_view text, std::vector<std::string>& out) {
    if (const void* nul = std::memchr(text.data(), '\0', text.size())) {
        const auto offset = static_cast<uint64_t>(stats_.bytes) +
                            static_cast<uint64_t>(static_cast<const char*>(nul) - text.data());
        throw Error(name_ + ": contains a NUL byte at offset " + std::to_string(offset) +
                    "; this looks like binary data, not a text corpus");
    }
    stats_.bytes += static_cast<int64_t>(text.size());
    size_t pos = 0;
    if (!partial_.empty()) {
        size_t end = text.find('\n');
        if (end == std::string_view::npos) {
            partial_.append(text);
            return;
        }
        partial_.append(text.substr(0, end));
        std::string l = std::move(partial_);
        partial_.clear();
        line(l, out);
        pos = end + 1;
    }
    while (pos < text.size()) {
        const void* nl = std::memchr(text.data() + pos, '\n', text.size() - pos);
        if (!nl) {
            partial_.assign(text.substr(pos));
            return;
        }
        size_t end = static_cast<size_t>(static_cast<const char*>(nl) - text.data());
        line(text.substr(pos, end - pos), out);
        pos = end + 1;
    }
}

void DocumentSplitter::finish(std::vector<std::string>& out) {
    if (!partial_.empty()) {
        std::string l = std::move(partial_);
        partial_.clear();
        line(l, out);
    }
    if (!current_.empty()) emit(std::move(current_), out);
    current_.clear();
}

void DocumentSplitter::line(std::string_view l, std::vector<std::string>& out) {
    ++line_no_;
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (format_ == CorpusFormat::Jsonl) {
        if (is_blank(l)) return;
        if (!is_valid_utf8(l)) {
            ++stats_.invalid_utf8;
            return;
        }
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(l);
        } catch (const nlohmann::json::parse_error& e) {
            throw Error(name_ + ":" + std::to_string(line_no_) + ": not a valid JSON line (" +
                        e.what() + ")");
        }
        auto it = j.is_object() ? j.find("text") : j.end();
        if (!j.is_object() || it == j.end() || !it->is_string())
            throw Error(name_ + ":" + std::to_string(line_no_) +
                        ": expected a JSON object with a string field \"text\"");
        emit(it->get<std::string>(), out);
        return;
    }
    std::string_view t = trim(l);
    if (t == kEndOfTextLine || (format_ == CorpusFormat::Paragraphs && t.empty())) {
        if (!current_.empty()) emit(std::move(current_), out);
        current_.clear();
        return;
    }
    if (current_.empty() && t.empty()) return;  // leading blank lines
    current_.append(l);
    current_.push_back('\n');
}

void DocumentSplitter::emit(std::string&& doc, std::vector<std::string>& out) {
    std::string_view t = trim(doc);
    if (t.empty()) return;
    if (!is_valid_utf8(t)) {
        ++stats_.invalid_utf8;
        return;
    }
    if (t.size() != doc.size()) {
        const size_t start = static_cast<size_t>(t.data() - doc.data()), len = t.size();
        doc.erase(start + len);
        doc.erase(0, start);
    }
    out.push_back(std::move(doc));
    ++stats_.documents;
}

std::vector<std::string> split_documents(std::string_view text, CorpusFormat format,
                                         CorpusStats* stats, std::string_view name) {
    if (format == CorpusFormat::Auto) format = detect_corpus_format(text, name);
    DocumentSplitter splitter(format, std::string(name));
    std::vector<std::string> docs;
    splitter.feed(text, docs);
    splitter.finish(docs);
    if (stats) *stats = splitter.stats();
    return docs;
}

// ---------------------------------------------------------------------------------------------
// CorpusReader

CorpusReader::CorpusReader(std::vector<std::string> paths, CorpusReaderOptions options)
    : options_(options) {
    if (paths.empty()) throw Error("no input files given");
    if (options_.chunk_bytes == 0) options_.chunk_bytes = 1;
    for (auto& p : paths) {
        struct stat st {};
        if (::stat(p.c_str(), &st) != 0)
            throw Error(p + ": cannot read input: " + std::strerror(errno));
        if (!S_ISREG(st.st_mode)) throw Error(p + ": not a regular file");
        CorpusFileInfo info;
        info.path = std::move(p);
        info.bytes = static_cast<uint64_t>(st.st_size);
        total_bytes_ += info.bytes;
        files_.push_back(std::move(info));
    }
}

CorpusReader::~CorpusReader() {
    close_file();
}

void CorpusReader::close_file() {
    if (file_) std::fclose(file_);
    file_ = nullptr;
}

CorpusStats CorpusReader::stats() const {
    CorpusStats s;
    for (size_t i = 0; i < files_.size() && i <= index_; ++i) {
        const CorpusStats& f = (i == index_ && splitter_) ? splitter_->stats() : files_[i].stats;
        s.documents += f.documents;
        s.bytes += f.bytes;
        s.invalid_utf8 += f.invalid_utf8;
    }
    return s;
}

bool CorpusReader::next(std::vector<std::string>& docs) {
    docs.clear();
    while (index_ < files_.size()) {
        CorpusFileInfo& info = files_[index_];
        if (!file_) {
            file_ = std::fopen(info.path.c_str(), "rb");
            if (!file_) throw Error(info.path + ": cannot open: " + std::strerror(errno));
            CorpusFormat format = options_.format;
            if (format == CorpusFormat::Auto) {
                buffer_.resize(kFormatDetectBytes);
                size_t n = std::fread(buffer_.data(), 1, buffer_.size(), file_);
                if (n < buffer_.size() && std::ferror(file_))
                    throw Error(info.path + ": read error: " + std::strerror(errno));
                buffer_.resize(n);
                format = detect_corpus_format(buffer_, info.path);
                std::rewind(file_);
            }
            info.format = format;
            splitter_ = std::make_unique<DocumentSplitter>(format, info.path);
        }
        buffer_.resize(options_.chunk_bytes);
        size_t n = std::fread(buffer_.data(), 1, buffer_.size(), file_);
        if (n < buffer_.size() && std::ferror(file_))
            throw Error(info.path + ": read error: " + std::strerror(errno));
        buffer_.resize(n);
        if (n > 0) {
            splitter_->feed(buffer_, docs);
            bytes_read_ += n;
            return true;
        }
        // End of this file.
        splitter_->finish(docs);
        info.stats = splitter_->stats();
        close_file();
        splitter_.reset();
        ++index_;
        if (info.stats.documents == 0) {
            if (info.stats.invalid_utf8 > 0)
                throw Error(info.path + ": no usable documents (all " +
                            std::to_string(info.stats.invalid_utf8) +
                            " documents are invalid UTF-8)");
            throw Error(info.path +
                        ": no documents (the file is empty or holds only blank "
                        "lines and separators)");
        }
        return true;
    }
    return false;
}

}  // namespace tmx
