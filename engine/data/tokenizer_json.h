// A Hugging Face tokenizer.json (the `tokenizers` library's file), read and run in C++ for the
// two families current models use: SentencePiece-style BPE with byte fallback (Llama 2,
// Mistral) and GPT-2-style byte-level BPE behind a regex pre-tokenizer (GPT-2, Llama 3, Qwen2
// and 3, DeepSeek). It computes what the library computes: added tokens split out first (raw or
// normalized), the normalizer, the pre-tokenizer, BPE by merge rank, and the decoder. A part
// the library has and this does not (a Unigram or WordPiece model, an unknown normalizer,
// pre-tokenizer or decoder) is refused by name when the file is loaded, never approximated.
// Tokenizer (tokenizer.h) is the interface the rest of tmx uses; this is one of its two models.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tmx {

class TokenizerJson {
  public:
    // Parses the file's text; `name` is used in error messages (a tmx::Error naming the field
    // and what was expected).
    static std::unique_ptr<TokenizerJson> parse(std::string_view json_text,
                                                const std::string& name);
    ~TokenizerJson();

    int32_t vocab_size() const;  // the largest id + 1 (model vocabulary and added tokens)
    // The token of an id as the file spells it ("Ġthe", "▁the", "<0x0A>", "<|im_end|>"); ""
    // for an id no token has.
    const std::string& token(int32_t id) const;
    // The id of a token, or -1.
    int32_t id_of(std::string_view token) const;
    bool is_special(int32_t id) const;        // an added token marked special
    bool is_byte_fallback(int32_t id) const;  // <0xNN> with byte fallback on
    int32_t unk_id() const;                   // -1 when the model has none

    // Text to ids, as the library's encode(text, add_special_tokens = false): added tokens in
    // the text become their ids. `continuation`: the text continues an earlier piece of the same
    // document, so the normalizer adds no dummy prefix (a Prepend normalizer, a Metaspace
    // pre-tokenizer's "first" prefix) before it.
    void encode(std::string_view text, bool continuation, std::vector<int32_t>& out) const;
    // Ids to text, as the library's decode(ids, skip_special_tokens = true).
    std::string decode(const std::vector<int32_t>& ids) const;

    // How one id decodes on its own, for a streaming decoder: raw bytes (a byte-level token, a
    // byte-fallback piece: joined with their neighbours into UTF-8), text, or nothing (special).
    struct Piece {
        enum class Kind : uint8_t { Text, Bytes, Special } kind = Kind::Text;
        std::string text;                // Text: the text; Bytes: the bytes
        bool strip_first_space = false;  // Text: the decoder drops this leading space at the start
    };
    Piece piece(int32_t id) const;

  private:
    struct Impl;
    explicit TokenizerJson(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace tmx
