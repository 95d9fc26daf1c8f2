#include "engine/interop/sentencepiece_model.h"

#include <cstring>

#include "engine/core/errors.h"

namespace tmx::interop {

namespace {

// Protobuf wire format: a field key is (number << 3 | wire type); varints are base-128, low
// group first; length-delimited fields (type 2) carry a varint length; fixed32 (type 5) is four
// little-endian bytes.
void put_varint(std::string& out, uint64_t v) {
    while (v >= 0x80) {
        out.push_back(static_cast<char>((v & 0x7f) | 0x80));
        v >>= 7;
    }
    out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, int field, int wire) {
    put_varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire));
}
void put_int(std::string& out, int field, int64_t v) {  // int32/enum/bool: negatives take 10 bytes
    put_key(out, field, 0);
    put_varint(out, static_cast<uint64_t>(v));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
    put_key(out, field, 2);
    put_varint(out, bytes.size());
    out += bytes;
}
void put_float(std::string& out, int field, float v) {
    put_key(out, field, 5);
    char b[4];
    std::memcpy(b, &v, 4);  // little-endian hosts only, as the rest of tmx
    out.append(b, 4);
}

}  // namespace

std::string sentencepiece_model_proto(const std::vector<VocabPiece>& pieces,
                                      const VocabSpecialIds& ids, const std::string& source) {
    const int64_t n = static_cast<int64_t>(pieces.size());
    for (const auto& [name, id] : {std::pair<const char*, int32_t>{"unknown", ids.unk},
                                   {"bos", ids.bos},
                                   {"eos", ids.eos},
                                   {"padding", ids.pad}})
        if (id < -1 || id >= n)
            throw Error(source + ": the " + std::string(name) + " token id " + std::to_string(id) +
                        " is outside the vocabulary of " + std::to_string(n));
    std::string out;
    bool has_bytes = false;
    for (size_t i = 0; i < pieces.size(); ++i) {
        const VocabPiece& p = pieces[i];
        if (p.type < 1 || p.type > 6)
            throw Error(source + ": token " + std::to_string(i) + " has type " +
                        std::to_string(p.type) + " (SentencePiece knows 1 to 6)");
        has_bytes = has_bytes || p.type == 6;
        std::string sp;  // ModelProto.SentencePiece: piece 1, score 2, type 3
        put_bytes(sp, 1, p.piece);
        put_float(sp, 2, p.score);
        if (p.type != 1) put_int(sp, 3, p.type);
        put_bytes(out, 1, sp);  // ModelProto.pieces = 1
    }
    std::string trainer;                      // ModelProto.trainer_spec = 2
    put_int(trainer, 3, 2);                   // model_type: BPE
    put_int(trainer, 4, n);                   // vocab_size
    put_int(trainer, 35, has_bytes ? 1 : 0);  // byte_fallback
    put_int(trainer, 40, ids.unk);
    put_int(trainer, 41, ids.bos);
    put_int(trainer, 42, ids.eos);
    put_int(trainer, 43, ids.pad);
    put_bytes(out, 2, trainer);
    std::string normalizer;  // ModelProto.normalizer_spec = 3
    put_bytes(normalizer, 1, "identity");
    put_int(normalizer, 3, 1);  // add_dummy_prefix
    put_int(normalizer, 4, 0);  // remove_extra_whitespaces
    put_int(normalizer, 5, 1);  // escape_whitespaces
    put_bytes(out, 3, normalizer);
    return out;
}

}  // namespace tmx::interop
