// Corpus input: text files split into documents, the way `tmx prepare` and `tmx tokenizer
// train` read them (and `tmx eval` scores text files).
//
// Formats (docs/design.md#14-token-datasets), chosen per file by `detect_corpus_format` unless
// given explicitly:
//   tinystories  documents separated by a line `<|endoftext|>` (TinyStories' own files);
//                blank lines inside a document are kept.
//   paragraphs   documents separated by one or more blank lines.
//   jsonl        one JSON object per line; the document is its string field "text".
// In every format: CRLF line ends become LF, a line `<|endoftext|>` is never part of a document,
// each document is trimmed of leading and trailing whitespace, and empty documents are dropped.
// A document that is not valid UTF-8 is skipped and counted (CorpusStats::invalid_utf8); in
// JSONL, a line that is not. A NUL byte (binary data) is an error naming the file and byte
// offset, so is a JSONL line that is not a JSON object with one string field "text" (naming
// the file and line number).
// Everything is streamed: memory does not grow with the size of a document or a line (see
// kMaxDocumentPieceBytes).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tmx {

enum class CorpusFormat { Auto, TinyStories, Paragraphs, Jsonl };

// "auto", "tinystories", "paragraphs", "jsonl"; anything else throws UsageError naming the
// option `format`.
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
// True when `text` (not empty) is the start of a valid UTF-8 character that is cut short.
bool is_incomplete_utf8(std::string_view text);
// Appends code point `cp` (not a surrogate, at most U+10FFFF) as UTF-8.
void append_utf8(uint32_t cp, std::string& out);

struct CorpusStats {
    int64_t documents = 0;     // documents produced
    int64_t bytes = 0;         // input bytes consumed
    int64_t invalid_utf8 = 0;  // documents skipped because they are not valid UTF-8
};

// The longest piece of a document the splitter hands on. A longer document comes in several
// pieces, so that no stage (the splitter, the reader, the tokenizer) ever holds a whole long
// document: memory stays bounded whatever the documents' sizes. A cut is made before the last
// space that starts a word within the first kMaxDocumentPieceBytes bytes, else at the last
// UTF-8 character boundary there; the pieces of a document concatenate to exactly its text.
inline constexpr size_t kMaxDocumentPieceBytes = size_t{64} << 10;

// Whitespace the splitter holds back so as to trim it from a document's end: a run longer than
// this is passed on as part of the document instead (so a document can end in whitespace only
// after such a run), and a `<|endoftext|>` line followed by more than this much whitespace is
// text, not a separator.
inline constexpr size_t kMaxHeldWhitespaceBytes = kMaxDocumentPieceBytes;

// A document, or a piece of one (see kMaxDocumentPieceBytes): each document is a run of pieces
// from one marked `first` to one marked `last` (a document of one piece is both).
struct DocumentPiece {
    std::string text;
    bool first = true;  // begins a document
    bool last = true;   // ends it
    // No text: the document whose earlier pieces came before turned out not to be valid UTF-8
    // and is skipped (counted in CorpusStats::invalid_utf8); discard those pieces.
    bool cancel = false;
};

// The streaming state machine behind both split_documents and CorpusReader: feed it one input's
// bytes in pieces of any size, then call finish(). Completed pieces are appended to the vector
// passed to feed()/finish(); the output does not depend on how the input was cut. It holds at
// most about kMaxDocumentPieceBytes + kMaxHeldWhitespaceBytes + the bytes of the current feed.
class DocumentSplitter {
  public:
    // `name` (a file path) is used in error messages.
    DocumentSplitter(CorpusFormat format, std::string name);
    ~DocumentSplitter();
    DocumentSplitter(const DocumentSplitter&) = delete;
    DocumentSplitter& operator=(const DocumentSplitter&) = delete;

    void feed(std::string_view text, std::vector<DocumentPiece>& out);
    void finish(std::vector<DocumentPiece>& out);

    CorpusFormat format() const { return format_; }
    const CorpusStats& stats() const { return stats_; }

  private:
    class JsonlLine;  // the streaming parser of one JSONL line (engine/data/jsonl_reader.h)
    // Where the current line of a text format stands: only whitespace so far; whitespace and
    // the first sep_matched_ bytes of `<|endoftext|>`; the whole separator and whitespace
    // (held in sep_tail_); or text.
    enum class LineState { Start, Separator, AfterSeparator, Text };

    void line_bytes(std::string_view bytes);  // part of the current line (no LF, no final CR)
    void line_end();
    void text_line_bytes(std::string_view bytes);
    void text_line_end();
    void separator_is_text();

    // The current document: doc_append takes its bytes in order (leading and trailing
    // whitespace are trimmed here); doc_end emits what is left as its last piece.
    void doc_append(std::string_view bytes);
    void hold_whitespace(std::string_view ws);
    void cut_pieces();
    bool emit_piece(std::string_view text, bool last);  // false: not valid UTF-8
    void doc_end();
    void doc_mark_invalid_utf8();  // skips the rest of the document

    CorpusFormat format_;
    std::string name_;
    std::vector<DocumentPiece>* out_ = nullptr;  // during feed() and finish()
    CorpusStats stats_;
    int64_t line_no_ = 1;      // the current line, 1-based
    bool pending_cr_ = false;  // the last feed ended in CR: dropped if LF follows

    LineState line_state_ = LineState::Start;
    size_t sep_matched_ = 0;
    std::string sep_tail_;
    std::unique_ptr<JsonlLine> jsonl_;

    bool doc_started_ = false;  // the document has non-whitespace text
    bool doc_emitted_ = false;  // a piece of it has been emitted
    bool doc_invalid_ = false;  // it is not valid UTF-8: skip its remaining bytes
    std::string doc_text_;      // text not yet emitted; ends in non-whitespace
    std::string doc_ws_;        // whitespace after doc_text_, held back
};

// Splits a whole text into documents exactly as `tmx prepare` does. Auto detects the format
// from the text (with `name` as the path for the .jsonl rule). Throws tmx::Error naming `name`
// for NUL bytes and bad JSONL lines; an empty result is not an error here.
std::vector<std::string> split_documents(std::string_view text, CorpusFormat format,
                                         CorpusStats* stats = nullptr,
                                         std::string_view name = "<text>");

struct CorpusReaderOptions {
    CorpusFormat format = CorpusFormat::Auto;  // Auto: detect per file (detect_corpus_format)
    size_t chunk_bytes = size_t{64} << 20;     // read size
};

// One input file as the reader saw it.
struct CorpusFileInfo {
    std::string path;
    uint64_t bytes = 0;
    CorpusFormat format = CorpusFormat::Auto;  // known once the file has been opened
    CorpusStats stats;
};

// Streams documents from a list of files without loading them whole: each call to next()
// reads one chunk and returns what it completed, in input order. A file that yields no
// documents is an error naming it; so is a path that is not a regular file (a FIFO, device or
// directory: never a hang or an endless read).
class CorpusReader {
  public:
    // Checks that every file can be opened and is a regular file (Error naming it otherwise).
    explicit CorpusReader(std::vector<std::string> paths, CorpusReaderOptions options = {});
    ~CorpusReader();
    CorpusReader(const CorpusReader&) = delete;
    CorpusReader& operator=(const CorpusReader&) = delete;

    // Replaces `pieces` with the next document pieces; returns false once every file is done
    // (then `pieces` is empty). May return true with none (a chunk inside a long document).
    // Holds at most one chunk plus what DocumentSplitter holds.
    bool next(std::vector<DocumentPiece>& pieces);
    // The same as whole documents: a long document is kept until its last piece arrives, so
    // memory grows with the longest document.
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
    int fd_ = -1;
    std::unique_ptr<DocumentSplitter> splitter_;
    std::string buffer_;
    std::vector<DocumentPiece> pieces_;  // next(docs)'s batch
    std::string assembling_;             // next(docs)'s unfinished document
    uint64_t bytes_read_ = 0, total_bytes_ = 0;
};

}  // namespace tmx
