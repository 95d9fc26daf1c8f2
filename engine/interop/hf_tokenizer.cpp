// tokenizer.json for a SentencePiece BPE model. How each part reproduces SentencePiece:
//
// - Encoding. SentencePiece's BPE starts from the text's characters and repeatedly joins the
//   adjacent pair whose concatenation is a piece with the highest score (the leftmost of equal
//   scores). The `tokenizers` BPE model joins the adjacent pair with the lowest merge rank (the
//   leftmost of equal ranks). So every way of cutting a piece into two pieces becomes a merge,
//   ranked by the joined piece's score: both then join the same pairs in the same order.
// - Normalization. An identity normalizer that escapes whitespace: " " becomes "▁"; the dummy
//   prefix is a "▁" put before the whole text (the Prepend normalizer, as SentencePiece always
//   adds it, also before a text that starts with a space).
// - Characters outside the vocabulary: their UTF-8 bytes as <0xNN> pieces (byte fallback), or
//   the unknown piece, consecutive unknowns fused into one, as SentencePiece does.
// - Decoding: "▁" back to " ", byte pieces joined into UTF-8, and the dummy prefix's space
//   stripped from the start.
// - Control and unknown pieces are special added tokens; user-defined pieces added tokens
//   matched in the normalized text (SentencePiece matches them before any merge).
#include "engine/interop/hf_tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "engine/core/errors.h"
#include "engine/data/corpus.h"

namespace tmx::interop {

namespace {

using json = nlohmann::ordered_json;

constexpr std::string_view kSpaceSymbol = "\xe2\x96\x81";  // U+2581 "▁"

// The length of the UTF-8 character starting with byte c (1 for a stray continuation byte).
size_t utf8_length(unsigned char c) {
    if (c >= 0xF0) return 4;
    if (c >= 0xE0) return 3;
    if (c >= 0xC0) return 2;
    return 1;
}

// Refuses what tokenizer.json cannot express exactly, naming it.
void check_representable(const Tokenizer& tok, const Tokenizer::ModelSpec& spec) {
    const auto refuse = [&](const std::string& what) {
        throw Error(tok.path() + ": " + what +
                    "; tokenizer.json is written for SentencePiece BPE " +
                    "models with the identity normalizer only");
    };
    if (spec.type != Tokenizer::ModelSpec::Type::Bpe)
        refuse(std::string("a SentencePiece ") +
               (spec.type == Tokenizer::ModelSpec::Type::Unigram ? "unigram" : "word or char") +
               " model");
    if (spec.has_charsmap || (spec.normalizer != "identity" && !spec.normalizer.empty()))
        refuse("normalizer '" + spec.normalizer + "' (a normalization map)");
    if (spec.has_denormalizer) refuse("a denormalizer");
    if (spec.remove_extra_whitespaces) refuse("remove_extra_whitespaces is on");
    if (!spec.escape_whitespaces) refuse("escape_whitespaces is off");
    if (spec.treat_whitespace_as_suffix) refuse("treat_whitespace_as_suffix is on");
    // tokenizer.json is JSON text: every piece must be UTF-8 (a SentencePiece model may hold
    // any bytes).
    for (int32_t id = 0; id < tok.vocab_size(); ++id)
        if (!is_valid_utf8(tok.piece(id)))
            refuse("piece " + std::to_string(id) + " is not valid UTF-8");
    // SentencePiece joins into an unused piece and splits it again at the end, which changes
    // the order of the other joins: a merge list cannot say that.
    for (int32_t id : spec.unused)
        if (tok.piece(id).size() > utf8_length(static_cast<unsigned char>(tok.piece(id)[0])))
            refuse("unused piece '" + tok.piece(id) + "' (id " + std::to_string(id) + ")");
}

json added_token(int32_t id, const std::string& content, bool special) {
    return {{"id", id},        {"content", content},     {"single_word", false}, {"lstrip", false},
            {"rstrip", false}, {"normalized", !special}, {"special", special}};
}

// Every (left, right) cut of a normal piece into two pieces, ranked by the joined piece's
// score (highest first), then its id, then the cut's position.
json merges(const Tokenizer& tok, const std::vector<bool>& mergeable) {
    std::unordered_map<std::string_view, int32_t> ids;
    for (int32_t id = 0; id < tok.vocab_size(); ++id)
        if (mergeable[static_cast<size_t>(id)]) ids.emplace(tok.piece(id), id);
    struct Merge {
        float score;
        int32_t id;
        size_t cut;
    };
    std::vector<Merge> list;
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
        if (!mergeable[static_cast<size_t>(id)]) continue;
        const std::string& p = tok.piece(id);
        for (size_t cut = utf8_length(static_cast<unsigned char>(p[0])); cut < p.size();
             cut += utf8_length(static_cast<unsigned char>(p[cut]))) {
            const std::string_view s(p);
            if (ids.contains(s.substr(0, cut)) && ids.contains(s.substr(cut)))
                list.push_back({tok.score(id), id, cut});
        }
    }
    std::sort(list.begin(), list.end(), [](const Merge& a, const Merge& b) {
        return std::tuple(-a.score, a.id, a.cut) < std::tuple(-b.score, b.id, b.cut);
    });
    json out = json::array();
    for (const Merge& m : list) {
        const std::string& p = tok.piece(m.id);
        out.push_back({p.substr(0, m.cut), p.substr(m.cut)});
    }
    return out;
}

}  // namespace

std::string tokenizer_json(const Tokenizer& tok, bool add_bos) {
    const Tokenizer::ModelSpec spec = tok.model_spec();
    check_representable(tok, spec);
    const int32_t n = tok.vocab_size();
    std::vector<bool> user_defined(static_cast<size_t>(n)), mergeable(static_cast<size_t>(n));
    for (int32_t id : spec.user_defined) user_defined[static_cast<size_t>(id)] = true;
    json added = json::array();
    json vocab = json::object();
    for (int32_t id = 0; id < n; ++id) {
        const std::string& piece = tok.piece(id);
        vocab[piece] = id;
        if (tok.is_control(id) || tok.is_unknown(id))
            added.push_back(added_token(id, piece, true));
        else if (user_defined[static_cast<size_t>(id)])
            added.push_back(added_token(id, piece, false));
        else if (!tok.is_byte(id) && !tok.is_unused(id))
            mergeable[static_cast<size_t>(id)] = true;
    }

    json normalizers = json::array();
    if (spec.add_dummy_prefix)
        normalizers.push_back({{"type", "Prepend"}, {"prepend", kSpaceSymbol}});
    normalizers.push_back(
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpaceSymbol}});

    json decoders = json::array();
    decoders.push_back(
        {{"type", "Replace"}, {"pattern", {{"String", kSpaceSymbol}}}, {"content", " "}});
    if (spec.byte_fallback) decoders.push_back({{"type", "ByteFallback"}});
    decoders.push_back({{"type", "Fuse"}});
    if (spec.add_dummy_prefix)
        decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});

    json post = nullptr;
    if (add_bos && tok.bos_id() >= 0) {
        const std::string bos = tok.piece(tok.bos_id());
        const auto special = [&](int type_id) {
            return json{{"SpecialToken", {{"id", bos}, {"type_id", type_id}}}};
        };
        const auto sequence = [](const char* id, int type_id) {
            return json{{"Sequence", {{"id", id}, {"type_id", type_id}}}};
        };
        post = {
            {"type", "TemplateProcessing"},
            {"single", {special(0), sequence("A", 0)}},
            {"pair", {special(0), sequence("A", 0), special(1), sequence("B", 1)}},
            {"special_tokens", {{bos, {{"id", bos}, {"ids", {tok.bos_id()}}, {"tokens", {bos}}}}}}};
    }

    json model = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", tok.unk_id() >= 0 ? json(tok.piece(tok.unk_id())) : json(nullptr)},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", true},
                  {"byte_fallback", spec.byte_fallback},
                  {"ignore_merges", false},
                  {"vocab", std::move(vocab)},
                  {"merges", merges(tok, mergeable)}};
    json doc = {{"version", "1.0"},
                {"truncation", nullptr},
                {"padding", nullptr},
                {"added_tokens", std::move(added)},
                {"normalizer", {{"type", "Sequence"}, {"normalizers", std::move(normalizers)}}},
                {"pre_tokenizer", nullptr},
                {"post_processor", std::move(post)},
                {"decoder", {{"type", "Sequence"}, {"decoders", std::move(decoders)}}},
                {"model", std::move(model)}};
    return doc.dump(1) + "\n";
}

}  // namespace tmx::interop
