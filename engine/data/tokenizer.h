// Tokenizers: loading, encoding, decoding (whole or streamed piece by piece), and training a
// byte-fallback BPE model on a corpus (engine/data/corpus.h reads the documents). A tokenizer is
// a SentencePiece model (tokenizer.model) or a Hugging Face tokenizer.json (engine/data/
// tokenizer_json.h), behind one interface.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/errors.h"
#include "engine/data/corpus.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace tmx {

class TokenizerJson;

class Tokenizer {
  public:
    // Loads a SentencePiece .model file or a tokenizer.json (with the tokenizer_config.json
    // beside it, when there is one, for the BOS, EOS and padding tokens); a directory means its
    // tokenizer.model, else its tokenizer.json (a checkpoint, a dataset, a Hugging Face model).
    // Throws tmx::Error naming the path when it is missing or not a tokenizer.
    static Tokenizer load(const std::string& path);
    // From the bytes of a .model file; `name` is used in error messages.
    static Tokenizer from_bytes(std::string_view model_bytes, const std::string& name);
    // From the text of a tokenizer.json and of its tokenizer_config.json ("" when none).
    static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json,
                               const std::string& name);

    bool is_sentencepiece() const { return sp_ != nullptr; }

    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;
    ~Tokenizer();

    const std::string& path() const { return path_; }
    int32_t vocab_size() const;
    int32_t bos_id() const;  // -1 when the model has none
    int32_t eos_id() const;
    int32_t unk_id() const;
    int32_t pad_id() const;

    // Text to ids, without BOS/EOS. Thread-safe (const).
    std::vector<int32_t> encode(std::string_view text) const;
    void encode(std::string_view text, std::vector<int32_t>& out) const;  // replaces `out`
    // Text in which the tokenizer's special tokens ("<s>", "<|im_start|>") stand for their ids,
    // as Hugging Face's tokenizers read a rendered chat template: a tokenizer.json does so
    // anyway; a SentencePiece model encodes the text between them, each stretch as a text of
    // its own (its dummy prefix included, as transformers' legacy Llama tokenizer does).
    std::vector<int32_t> encode_with_special_tokens(std::string_view text) const;
    // Text that continues an earlier piece of the same document (a DocumentPiece that is not
    // `first`): encoded without adding SentencePiece's dummy-prefix "▁" again, so that the
    // pieces' ids decode to the whole text and are the whole text's ids but where a token
    // would span a cut (none does when the cut is before a space, as the splitter prefers).
    // Thread-safe; replaces `out`.
    void encode_continuation(std::string_view text, std::vector<int32_t>& out) const;
    // Ids to text, exactly as SentencePiece decodes them (control ids vanish, invalid byte
    // sequences become U+FFFD), or a tokenizer.json's decoder (special tokens skipped). Throws
    // tmx::Error for ids outside [0, vocab_size).
    std::string decode(const std::vector<int32_t>& ids) const;

    // The raw piece of an id ("▁the", "<0x0A>", "<s>").
    const std::string& piece(int32_t id) const;
    bool is_control(int32_t id) const;
    bool is_byte(int32_t id) const;
    bool is_unknown(int32_t id) const;
    bool is_unused(int32_t id) const;
    float score(int32_t id) const;  // the piece's score in the model (BPE merge priority)
    int32_t byte_pieces() const;    // how many <0xNN> pieces (256 with byte fallback)

    // What a SentencePiece model's own spec (its ModelProto) says about how it tokenizes: what
    // an exporter must reproduce. Parsed from the model's bytes; a tmx::Error when they do not
    // parse or the tokenizer is a tokenizer.json.
    struct ModelSpec {
        enum class Type : int { Unigram = 1, Bpe = 2, Word = 3, Char = 4 };
        Type type = Type::Unigram;  // TrainerSpec.model_type (protobuf's default)
        bool byte_fallback = false;
        bool treat_whitespace_as_suffix = false;
        std::string normalizer;         // NormalizerSpec.name: "identity", "nmt_nfkc", ...
        bool has_charsmap = false;      // a precompiled normalization map (normalizes the text)
        bool has_denormalizer = false;  // a denormalizer map (applied when decoding)
        bool add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
        std::vector<int32_t> user_defined, unused;  // ids of USER_DEFINED and UNUSED pieces
    };
    ModelSpec model_spec() const;

    // Per-id facts the streaming decoder uses.
    // Bytes: a byte-level token's bytes (GPT-2-style tokenizer.json), held like Byte pieces
    // until they make whole UTF-8 characters.
    enum class Kind : uint8_t { Normal, Byte, Bytes, Control, Unknown };
    struct PieceInfo {
        Kind kind = Kind::Normal;
        uint8_t byte = 0;            // Byte: the byte value
        bool leading_space = false;  // Normal: a space the decoder drops at the start of a text
        std::string text;  // Normal: the piece with "▁" as ' '; Unknown: its surface; Bytes: them
    };
    const PieceInfo& info(int32_t id) const;

  private:
    Tokenizer();
    void check_id(int32_t id) const;

    struct Continuation;

    std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;  // null for a tokenizer.json
    std::unique_ptr<TokenizerJson> json_;                        // null for SentencePiece
    int32_t json_bos_ = -1, json_eos_ = -1, json_pad_ = -1;
    std::unique_ptr<Continuation> continuation_;
    std::vector<PieceInfo> info_;
    std::string path_;
};

// Decodes a token stream incrementally (for printing text while generating): push() returns
// the text that became final with each id. Byte-fallback pieces that together make one UTF-8
// character are held until the character is complete. The concatenation of every push() and
// a final flush() equals Tokenizer::decode of the whole id sequence.
class StreamDecoder {
  public:
    explicit StreamDecoder(const Tokenizer& tokenizer) : tok_(&tokenizer) {}
    std::string push(int32_t id);
    void push(int32_t id, std::string& out);  // appends
    // Emits any held incomplete bytes (as U+FFFD each) and returns them.
    std::string flush();
    // Starts a new text (the leading-space rule applies again).
    void reset();

  private:
    void drain(std::string& out, bool final);

    const Tokenizer* tok_;
    std::string pending_;  // bytes of consecutive byte pieces not yet emitted
    bool at_start_ = true;
};

// The requested vocabulary cannot be trained on this corpus. `largest` is the largest size
// SentencePiece says works (too large), or `smallest` the least it needs (too small); the
// other is 0.
class VocabSizeError : public Error {
  public:
    VocabSizeError(const std::string& what, int64_t requested, int64_t largest, int64_t smallest)
        : Error(what), requested(requested), largest(largest), smallest(smallest) {}
    int64_t requested, largest, smallest;
};

struct TokenizerTrainOptions {
    // Sentences (lines of documents) sampled uniformly from the whole corpus for training, so
    // a large corpus fits in memory; the corpus is still read once end to end.
    int64_t max_sentences = 1'000'000;
    CorpusFormat format = CorpusFormat::Auto;
    double character_coverage = 0.9995;  // rarer characters are left to byte fallback
    int max_sentence_bytes = 16384;      // longer lines are skipped by SentencePiece
    uint32_t seed = 1;                   // sampling seed: same input, same model
    bool overwrite = false;              // replace an existing output file
    bool verbose = false;                // let SentencePiece log to stderr
    // Called from time to time while the corpus is read (bytes read, total bytes).
    std::function<void(uint64_t, uint64_t)> progress;
};

struct TokenizerTrainReport {
    int32_t vocab_size = 0;
    CorpusStats corpus;     // documents, bytes, skipped
    int64_t sentences = 0;  // lines offered to SentencePiece
    double seconds = 0;
};

// Trains a SentencePiece BPE model (byte_fallback, split_digits, identity normalisation,
// unk=0 bos=1 eos=2, no pad: the layout of the LLaMA 32k tokenizer) on the documents of
// `inputs` and writes it atomically to `out_path`. Threads: tmx::num_threads().
// Throws VocabSizeError when `vocab_size` does not fit the corpus.
TokenizerTrainReport train_tokenizer(const std::vector<std::string>& inputs, int vocab_size,
                                     const std::string& out_path,
                                     const TokenizerTrainOptions& options = {});

}  // namespace tmx
