// Constrained decoding: which tokens keep a generation's text a prefix of a text the grammar
// (json_schema.h) accepts. A token's text is exactly what the engine's detokenization
// (StreamDecoder, TextStream) appends for it in the middle of a generated text: a SentencePiece
// piece with "▁" as a space, a byte-fallback piece's one byte, a byte-level tokenizer.json
// token's bytes; the first piece of a text (a prompt of control tokens only, e.g. BOS alone)
// loses its leading space, as the decoder drops it there. Control tokens, the unknown token and
// tokens whose text is empty are never allowed; the ends of a document (EOS, BOS) only once the
// value is complete.
//
// The vocabulary's texts sit in a trie built once per tokenizer (TokenVocabulary, immutable,
// shared by every request). The tokens allowed in an automaton state are found by walking the
// trie with the automaton, pruning a branch at its first refused byte, once per state: each
// decode step then costs a cache lookup and applying the mask (sampling.h's TokenMask).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/data/tokenizer.h"
#include "engine/infer/json_schema.h"
#include "engine/infer/sampling.h"

namespace tmx {

class TokenVocabulary {
  public:
    explicit TokenVocabulary(const Tokenizer& tokenizer);

    int32_t size() const { return static_cast<int32_t>(mid_.size()); }
    // What generating `id` appends to the text: in its middle, or as its first piece. "" for a
    // token never allowed.
    const std::string& text(int32_t id, bool at_start) const {
        return (at_start ? start_ : mid_)[static_cast<size_t>(id)];
    }
    // Whether a text continuing `prompt` starts fresh (the prompt decodes to nothing: control
    // tokens only), so that its first piece loses its leading space.
    bool starts_text(std::span<const int32_t> prompt) const;

    // The token texts as a trie: node 0 is the root; a node's children are
    // child_[first_child_[n] .. first_child_[n + 1]), the tokens ending at it
    // tokens_[first_token_[n] .. first_token_[n + 1]).
    struct Trie {
        std::vector<uint32_t> first_child, first_token;
        std::vector<uint8_t> byte;  // the byte leading into each node
        std::vector<int32_t> child, tokens;
    };
    const Trie& trie(bool at_start) const { return at_start ? start_trie_ : mid_trie_; }

  private:
    static Trie build_trie(const std::vector<std::string>& texts);

    std::vector<std::string> mid_, start_;
    std::vector<char> control_;  // decodes to nothing (the decoder stays at the start)
    Trie mid_trie_, start_trie_;
};

// One request's constraint: the grammar's automaton over one vocabulary, with the tokens allowed
// in each state cached as they are first asked for. Thread-safe: the sequences of a request draw
// on several threads at once.
class TokenConstraint {
  public:
    // `end_ids`: the tokens that end a document, allowed once the value is complete.
    TokenConstraint(std::shared_ptr<const JsonGrammar> grammar,
                    std::shared_ptr<const TokenVocabulary> vocabulary,
                    std::vector<int32_t> end_ids);

    struct State {
        int32_t dfa = 0;  // JsonDfa's state; JsonDfa::kDead after a refused token
        bool at_start = false;
    };
    // Before the first token of a sequence continuing `prompt`.
    State start(std::span<const int32_t> prompt) const;
    // The tokens that may come next (at least one unless the vocabulary cannot write what the
    // grammar needs here). The reference stays valid for the constraint's life.
    const TokenMask& allowed(State state);
    // After `token` (not an end id).
    State advance(State state, int32_t token);
    // The value is complete and nothing may follow it: the generation ends here.
    bool finished(State state);

    // Why no token is allowed where the automaton gave up (it outgrew JsonDfa::kMaxStates), or
    // "".
    std::string failure();

    // For benchmarks and tests: the states the automaton has so far.
    size_t automaton_states();

  private:
    void compute_mask(State state, TokenMask& mask);

    std::shared_ptr<const TokenVocabulary> vocabulary_;
    const std::vector<int32_t> end_ids_;
    std::mutex mutex_;
    JsonDfa dfa_;
    std::vector<std::unique_ptr<TokenMask>> masks_[2];  // by at_start, then DFA state
    const TokenMask nothing_;                           // a refused token's state allows none
    std::string failure_;
};

}  // namespace tmx
