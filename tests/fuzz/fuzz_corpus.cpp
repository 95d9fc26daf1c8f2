// libFuzzer target: the corpus reader's DocumentSplitter (engine/data/corpus.h) on arbitrary bytes
// in each format. Beyond not crashing, it checks the splitter's promises: the same pieces and
// errors however the input is cut into feeds; pieces of at most kMaxDocumentPieceBytes, each
// valid UTF-8, in well-formed runs (first ... last, or first ... cancel).
// Input: byte 0 picks the format, and with its top bit a long text from a short input: the rest
// written "head \x01 unit \x01 tail" becomes head + unit repeated past kMaxDocumentPieceBytes
// + tail (without two \x01: all of it repeated). Byte 1 picks the feed size.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/errors.h"
#include "engine/data/corpus.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using tmx::DocumentPiece;
using tmx::fuzz::require;

struct Split {
    std::vector<DocumentPiece> pieces;
    std::string error;
    tmx::CorpusStats stats;
};

Split split(tmx::CorpusFormat format, std::string_view text, size_t feed_bytes) {
    Split r;
    tmx::DocumentSplitter splitter(format, "fuzz.txt");
    try {
        for (size_t pos = 0; pos < text.size(); pos += feed_bytes)
            splitter.feed(text.substr(pos, feed_bytes), r.pieces);
        splitter.finish(r.pieces);
    } catch (const tmx::Error& e) {
        r.error = e.what();
    }
    r.stats = splitter.stats();
    return r;
}

bool same(const DocumentPiece& a, const DocumentPiece& b) {
    return a.text == b.text && a.first == b.first && a.last == b.last && a.cancel == b.cancel;
}

void check_pieces(const std::vector<DocumentPiece>& pieces, int64_t documents) {
    bool in_document = false;
    int64_t completed = 0;
    for (const DocumentPiece& p : pieces) {
        if (p.cancel) {
            require(in_document && !p.first && p.text.empty(), "cancel outside a document");
            in_document = false;
            continue;
        }
        require(p.first != in_document, "first flag out of order");
        require(p.text.size() <= tmx::kMaxDocumentPieceBytes, "piece too long");
        require(tmx::is_valid_utf8(p.text), "piece not valid UTF-8");
        if (p.first) require(!p.text.empty(), "empty first piece");
        in_document = !p.last;
        completed += p.last;
    }
    require(!in_document, "unfinished document");
    require(completed == documents, "document count");
}

std::string lengthen(const std::string& input) {
    const size_t a = input.find('\x01');
    const size_t b = a == std::string::npos ? a : input.find('\x01', a + 1);
    const bool marked = b != std::string::npos && b > a + 1;
    const std::string unit = marked ? input.substr(a + 1, b - a - 1) : input;
    if (unit.empty()) return input;
    std::string text = marked ? input.substr(0, a) : "";
    while (text.size() <= tmx::kMaxDocumentPieceBytes + 1000) text += unit;
    return marked ? text + input.substr(b + 1) : text;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 2) return 0;
    static constexpr tmx::CorpusFormat formats[] = {
        tmx::CorpusFormat::Paragraphs, tmx::CorpusFormat::TinyStories, tmx::CorpusFormat::Jsonl};
    const tmx::CorpusFormat format = formats[data[0] % 3];
    const size_t feed_bytes = 1 + data[1];
    std::string text(tmx::fuzz::as_text(data + 2, size - 2));
    if (data[0] & 0x80) text = lengthen(text);
    const Split whole = split(format, text, text.size() + 1);
    const Split parts = split(format, text, feed_bytes);
    require(whole.error == parts.error, "error depends on the feed size");
    if (!whole.error.empty()) return 0;
    require(whole.pieces.size() == parts.pieces.size(), "piece count depends on the feed size");
    for (size_t i = 0; i < whole.pieces.size(); ++i)
        require(same(whole.pieces[i], parts.pieces[i]), "pieces depend on the feed size");
    require(whole.stats.documents == parts.stats.documents &&
                whole.stats.invalid_utf8 == parts.stats.invalid_utf8,
            "stats depend on the feed size");
    check_pieces(whole.pieces, whole.stats.documents);
    return 0;
}
