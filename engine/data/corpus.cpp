#include "engine/data/corpus.h"

#include <string.h>  // memrchr
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/data/jsonl_reader.h"

namespace tmx {

using corpus_detail::is_space;

namespace {

std::string_view trim(std::string_view s) {
    size_t a = 0, b = s.size();
    while (a < b && is_space(s[a])) ++a;
    while (b > a && is_space(s[b - 1])) --b;
    return s.substr(a, b - a);
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
    throw UsageError(opt("format") + ": expected auto, tinystories, paragraphs or jsonl, got '" +
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

void append_utf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
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

bool is_incomplete_utf8(std::string_view text) {
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    const unsigned char c = p[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return false;
    }
    if (text.size() >= need) return false;
    for (size_t i = 1; i < text.size(); ++i) {
        const unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (p[i] < l || p[i] > h) return false;
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// DocumentSplitter

DocumentSplitter::DocumentSplitter(CorpusFormat format, std::string name)
    : format_(format), name_(std::move(name)) {
    if (format_ == CorpusFormat::Auto)
        throw Error(name_ + ": internal error: DocumentSplitter needs a concrete format");
    if (format_ == CorpusFormat::Jsonl) jsonl_ = std::make_unique<JsonlLine>(*this);
}

DocumentSplitter::~DocumentSplitter() = default;

void DocumentSplitter::feed(std::string_view text, std::vector<DocumentPiece>& out) {
    // The bytes before a NUL are split first, so that an error in them comes first, as it
    // would have had the input arrived in other pieces.
    const auto* nul = static_cast<const char*>(std::memchr(text.data(), '\0', text.size()));
    if (nul) text = text.substr(0, static_cast<size_t>(nul - text.data()));
    const uint64_t nul_offset = static_cast<uint64_t>(stats_.bytes) + text.size();
    stats_.bytes += static_cast<int64_t>(text.size());
    out_ = &out;
    // A CR that ends a feed may be half of a CRLF: it waits for the next byte.
    auto release_pending_cr = [&] {
        if (pending_cr_) line_bytes("\r");
        pending_cr_ = false;
    };
    size_t pos = 0;
    while (pos < text.size()) {
        const void* nl = std::memchr(text.data() + pos, '\n', text.size() - pos);
        const size_t end =
            nl ? static_cast<size_t>(static_cast<const char*>(nl) - text.data()) : text.size();
        std::string_view part = text.substr(pos, end - pos);
        if (part.empty())
            pending_cr_ = false;  // it was the CR of a CRLF
        else
            release_pending_cr();
        const bool cr = !part.empty() && part.back() == '\r';
        if (cr) part.remove_suffix(1);  // CRLF becomes LF
        if (!part.empty()) line_bytes(part);
        if (!nl) {
            pending_cr_ = cr;
            break;
        }
        line_end();
        pos = end + 1;
    }
    out_ = nullptr;
    if (nul)
        throw Error(name_ + ": contains a NUL byte at offset " + std::to_string(nul_offset) +
                    "; this looks like binary data, not a text corpus");
}

void DocumentSplitter::finish(std::vector<DocumentPiece>& out) {
    out_ = &out;
    pending_cr_ = false;  // a final CR goes like the CR of a CRLF
    line_end();           // an unfinished last line ends here
    doc_end();
    out_ = nullptr;
}

void DocumentSplitter::line_bytes(std::string_view bytes) {
    if (jsonl_)
        jsonl_->bytes(bytes);
    else
        text_line_bytes(bytes);
}

void DocumentSplitter::line_end() {
    if (jsonl_)
        jsonl_->end();
    else
        text_line_end();
    ++line_no_;
}

void DocumentSplitter::text_line_bytes(std::string_view b) {
    auto leading_space = [&] {
        size_t i = 0;
        while (i < b.size() && is_space(b[i])) ++i;
        return i;
    };
    while (!b.empty()) {
        switch (line_state_) {
            case LineState::Text:
                doc_append(b);
                return;
            case LineState::Start: {
                const size_t n = leading_space();
                doc_append(b.substr(0, n));  // whitespace: held back or trimmed
                b.remove_prefix(n);
                if (!b.empty()) line_state_ = LineState::Separator;
                break;
            }
            case LineState::Separator:
                while (!b.empty() && sep_matched_ < kEndOfTextLine.size() &&
                       b.front() == kEndOfTextLine[sep_matched_]) {
                    ++sep_matched_;
                    b.remove_prefix(1);
                }
                if (sep_matched_ == kEndOfTextLine.size())
                    line_state_ = LineState::AfterSeparator;
                else if (!b.empty())
                    separator_is_text();
                break;
            case LineState::AfterSeparator: {
                const size_t n = leading_space();
                sep_tail_.append(b.substr(0, n));
                b.remove_prefix(n);
                if (!b.empty() || sep_tail_.size() > kMaxHeldWhitespaceBytes) separator_is_text();
                break;
            }
        }
    }
}

void DocumentSplitter::separator_is_text() {
    line_state_ = LineState::Text;
    doc_append(kEndOfTextLine.substr(0, sep_matched_));
    doc_append(sep_tail_);
    sep_matched_ = 0;
    sep_tail_.clear();
}

void DocumentSplitter::text_line_end() {
    switch (line_state_) {
        case LineState::Start:  // a blank line
            if (format_ == CorpusFormat::Paragraphs)
                doc_end();
            else
                doc_append("\n");
            break;
        case LineState::Separator:
            separator_is_text();
            doc_append("\n");
            break;
        case LineState::AfterSeparator:
            sep_matched_ = 0;
            sep_tail_.clear();
            doc_end();
            break;
        case LineState::Text:
            doc_append("\n");
            break;
    }
    line_state_ = LineState::Start;
}

void DocumentSplitter::doc_append(std::string_view bytes) {
    if (doc_invalid_) return;
    if (!doc_started_) {
        size_t i = 0;
        while (i < bytes.size() && is_space(bytes[i])) ++i;
        bytes.remove_prefix(i);
        if (bytes.empty()) return;
        doc_started_ = true;
    }
    size_t end = bytes.size();
    while (end > 0 && is_space(bytes[end - 1])) --end;
    if (end > 0) {
        doc_text_ += doc_ws_;
        doc_ws_.clear();
        doc_text_.append(bytes.substr(0, end));
        cut_pieces();
    }
    hold_whitespace(bytes.substr(end));
}

void DocumentSplitter::hold_whitespace(std::string_view ws) {
    if (ws.empty() || doc_invalid_) return;
    doc_ws_.append(ws);
    // Too much to hold: pass it on as text, whole multiples of the limit so that the result
    // does not depend on how the input arrived.
    constexpr size_t unit = kMaxHeldWhitespaceBytes + 1;
    if (doc_ws_.size() >= unit) {
        const size_t n = doc_ws_.size() / unit * unit;
        doc_text_.append(doc_ws_, 0, n);
        doc_ws_.erase(0, n);
        cut_pieces();
    }
}

namespace {

// Where to end the next piece of `text` (longer than kMaxDocumentPieceBytes): before the last
// space that starts a word, so that the tokenizer sees whole words; else at a UTF-8 character
// boundary. Looks only at the first kMaxDocumentPieceBytes + 1 bytes, so the cuts do not
// depend on how much text is waiting.
size_t piece_length(std::string_view text) {
    constexpr size_t max = kMaxDocumentPieceBytes;
    size_t last = max - 1;  // search [1, last]: the piece is never empty
    while (last > 0) {
        const void* space = ::memrchr(text.data() + 1, ' ', last);
        if (!space) break;
        const auto p = static_cast<size_t>(static_cast<const char*>(space) - text.data());
        if (!is_space(text[p + 1])) return p;
        last = p - 1;
    }
    size_t p = max;
    while (p > max - 3 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
    return p;
}

}  // namespace

void DocumentSplitter::cut_pieces() {
    size_t start = 0;
    while (doc_text_.size() - start > kMaxDocumentPieceBytes) {
        const std::string_view rest = std::string_view(doc_text_).substr(start);
        const size_t n = piece_length(rest);
        if (!emit_piece(rest.substr(0, n), false)) return;
        start += n;
    }
    doc_text_.erase(0, start);
}

bool DocumentSplitter::emit_piece(std::string_view text, bool last) {
    if (!is_valid_utf8(text)) {
        doc_mark_invalid_utf8();
        return false;
    }
    out_->push_back(DocumentPiece{std::string(text), !doc_emitted_, last, false});
    doc_emitted_ = true;
    if (last) ++stats_.documents;
    return true;
}

void DocumentSplitter::doc_end() {
    if (doc_started_ && !doc_invalid_) emit_piece(doc_text_, true);
    doc_started_ = doc_emitted_ = doc_invalid_ = false;
    doc_text_.clear();
    doc_ws_.clear();
}

void DocumentSplitter::doc_mark_invalid_utf8() {
    if (doc_invalid_) return;
    ++stats_.invalid_utf8;
    if (doc_emitted_) out_->push_back(DocumentPiece{{}, false, true, true});
    doc_invalid_ = true;
    doc_text_.clear();
    doc_ws_.clear();
}

namespace {

// Joins pieces into whole documents; `partial` carries an unfinished one between calls.
void assemble_documents(std::vector<DocumentPiece>& pieces, std::string& partial,
                        std::vector<std::string>& docs) {
    for (DocumentPiece& p : pieces) {
        if (p.first || p.cancel) partial.clear();
        if (p.cancel) continue;
        if (p.first && p.last) {
            docs.push_back(std::move(p.text));
            continue;
        }
        partial += p.text;
        if (p.last) {
            docs.push_back(std::move(partial));
            partial.clear();
        }
    }
}

}  // namespace

std::vector<std::string> split_documents(std::string_view text, CorpusFormat format,
                                         CorpusStats* stats, std::string_view name) {
    if (format == CorpusFormat::Auto) format = detect_corpus_format(text, name);
    DocumentSplitter splitter(format, std::string(name));
    std::vector<DocumentPiece> pieces;
    splitter.feed(text, pieces);
    splitter.finish(pieces);
    std::vector<std::string> docs;
    std::string partial;
    assemble_documents(pieces, partial, docs);
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
        const int fd = open_regular_file(p);
        struct stat st {};
        const int rc = ::fstat(fd, &st);
        const int err = errno;
        ::close(fd);
        if (rc != 0) throw Error(p + ": cannot stat: " + std::strerror(err));
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
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
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

namespace {

// Reads up to buffer.size() bytes at `offset` (or at the file position when offset < 0);
// shrinks `buffer` to what was read.
void read_some(int fd, const std::string& path, std::string& buffer, off_t offset = -1) {
    size_t got = 0;
    while (got < buffer.size()) {
        const ssize_t n = offset < 0 ? ::read(fd, buffer.data() + got, buffer.size() - got)
                                     : ::pread(fd, buffer.data() + got, buffer.size() - got,
                                               offset + static_cast<off_t>(got));
        if (n == 0) break;
        if (n < 0) {
            if (errno == EINTR) continue;
            throw Error(path + ": read error: " + std::strerror(errno));
        }
        got += static_cast<size_t>(n);
    }
    buffer.resize(got);
}

}  // namespace

void CorpusReader::open_next_file() {
    CorpusFileInfo& info = files_[index_];
    fd_ = open_regular_file(info.path);
    CorpusFormat format = options_.format;
    if (format == CorpusFormat::Auto) {
        buffer_.resize(kFormatDetectBytes);
        read_some(fd_, info.path, buffer_, 0);
        format = detect_corpus_format(buffer_, info.path);
    }
    info.format = format;
    splitter_ = std::make_unique<DocumentSplitter>(format, info.path);
}

bool CorpusReader::next(std::vector<DocumentPiece>& pieces) {
    pieces.clear();
    while (index_ < files_.size()) {
        CorpusFileInfo& info = files_[index_];
        if (fd_ < 0) open_next_file();
        buffer_.resize(options_.chunk_bytes);
        read_some(fd_, info.path, buffer_);
        if (!buffer_.empty()) {
            splitter_->feed(buffer_, pieces);
            bytes_read_ += buffer_.size();
            return true;
        }
        // End of this file.
        splitter_->finish(pieces);
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

bool CorpusReader::next(std::vector<std::string>& docs) {
    docs.clear();
    const bool more = next(pieces_);
    assemble_documents(pieces_, assembling_, docs);
    return more;
}

}  // namespace tmx
