// Corpus input: text files split into documents, the way `tmx prepare` and `tmx tokenizer
// train` read them (and `tmx eval` scores text files).
//
// Formats (DESIGN §3), chosen per file by `detect_corpus_format` unless given explicitly:
//   tinystories  documents separated by a line `<|endoftext|>` (TinyStories' own files);
//                blank lines inside a document are kept.
//   paragraphs   documents separated by one or more blank lines.
//   jsonl        one JSON object per line; the document is its string field "text".
// In every format: CRLF line ends become LF, a line `<|endoftext|>` is never part of a document,
// each document is trimmed of leading and trailing whitespace, and empty documents are dropped.
// A document that is not valid UTF-8 is skipped and counted (CorpusStats::invalid_utf8).
// A NUL byte (binary data) is an error naming the file and byte offset, so is a JSONL line that
// is not a JSON object with a string "text" (naming the file and line number).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tmx {

enum class CorpusFormat { Auto, TinyStories, Paragraphs, Jsonl };

// "auto", "tinystories", "paragraphs", "jsonl"; anything else throws UsageError naming --format.
CorpusFormat parse_corpus_format(std::string_view name);
const char* to_string(CorpusFormat format);

// The separator line of the tinystories format.
inline constexpr std::string_view kEndOfTextLine = "<|endoftext|>";

// How much of a file's start format detection looks at.
inline constexpr size_t kFormatDetectBytes = size_t{1} << 20;

// The format of a file from its name and its first kFormatDetectBytes bytes (the rest of `head`
// is ignored): jsonl when the name ends in .jsonl or the first non-blank line starts with '{';
// tinystories when a line `<|endoftext|>` occurs; paragraphs otherwise. Never returns Auto.
CorpusFormat detect_corpus_format(std::string_view head, std::string_view path = "");

// Strict UTF-8 (no overlong forms, surrogates or code points above U+10FFFF).
bool is_valid_utf8(std::string_view text);
// Length of the valid UTF-8 character at the start of `text`, or 0 when it does not start with
// one (including when it is cut short).
size_t utf8_char_length(std::string_view text);

struct CorpusStats {
    int64_t documents = 0;     // documents produced
    int64_t bytes = 0;         // input bytes consumed
    int64_t invalid_utf8 = 0;  // documents skipped because they are not valid UTF-8
};

// The line-oriented state machine behind both split_documents and CorpusReader: feed it one
// input's bytes in pieces of any size, then call finish(). Completed documents are appended to
// the vector passed to feed()/finish().
class DocumentSplitter {
  public:
    // `name` (a file path) is used in error messages.
    DocumentSplitter(CorpusFormat format, std::string name);

    void feed(std::string_view text, std::vector<std::string>& out);
    void finish(std::vector<std::string>& out);

    CorpusFormat format() const { return format_; }
    const CorpusStats& stats() const { return stats_; }

  private:
    void line(std::string_view line, std::vector<std::string>& out);
    void emit(std::string&& doc, std::vector<std::string>& out);

    CorpusFormat format_;
    std::string name_;
    std::string partial_;  // an incomplete last line carried to the next feed()
    std::string current_;  // the document being assembled (text formats)
    int64_t line_no_ = 0;
    CorpusStats stats_;
};

// Splits a whole text into documents exactly as `tmx prepare` does. Auto detects the format
// from the text (with `name` as the path for the .jsonl rule). Throws tmx::Error naming `name`
// for NUL bytes and bad JSONL lines; an empty result is not an error here.
std::vector<std::string> split_documents(std::string_view text, CorpusFormat format,
                                         CorpusStats* stats = nullptr,
                                         std::string_view name = "<text>");

struct CorpusReaderOptions {
    CorpusFormat format = CorpusFormat::Auto;  // Auto: detect per file (detect_corpus_format)
    size_t chunk_bytes = size_t{64} << 20;     // read size; documents are cut at line ends
};

// One input file as the reader saw it.
struct CorpusFileInfo {
    std::string path;
    uint64_t bytes = 0;
    CorpusFormat format = CorpusFormat::Auto;  // known once the file has been opened
    CorpusStats stats;
};

// Streams documents from a list of files without loading them whole: each call to next()
// reads about one chunk and returns the documents completed in it, in input order. A file that
// yields no documents is an error naming it.
class CorpusReader {
  public:
    // Checks that every file exists and is a regular file (Error naming it otherwise).
    explicit CorpusReader(std::vector<std::string> paths, CorpusReaderOptions options = {});
    ~CorpusReader();
    CorpusReader(const CorpusReader&) = delete;
    CorpusReader& operator=(const CorpusReader&) = delete;

    // Replaces `docs` with the next documents; returns false once every file is done (then
    // `docs` is empty). May return true with no documents (a chunk inside a long document).
    bool next(std::vector<std::string>& docs);

    uint64_t bytes_read() const { return bytes_read_; }
    uint64_t total_bytes() const { return total_bytes_; }
    // Totals over the files read so far.
    CorpusStats stats() const;
    const std::vector<CorpusFileInfo>& files() const { return files_; }

  private:
    void open_next_file();
    void close_file();

    CorpusReaderOptions options_;
    std::vector<CorpusFileInfo> files_;
    size_t index_ = 0;  // the file being read
    std::FILE* file_ = nullptr;
    std::unique_ptr<DocumentSplitter> splitter_;
    std::string buffer_;
    uint64_t bytes_read_ = 0, total_bytes_ = 0;
};

}  // namespace tmx
