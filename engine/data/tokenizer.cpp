#include "engine/data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <unordered_map>

#include "engine/core/file_io.h"
#include "engine/core/threads.h"
#include "engine/data/tokenizer_json.h"
#include "engine/model/checkpoint.h"

namespace tmx {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";      // "▁"
constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
    std::string out;
    out.reserve(s.size());
    size_t pos = 0;
    while (true) {
        size_t hit = s.find(from, pos);
        if (hit == std::string_view::npos) break;
        out.append(s.substr(pos, hit - pos));
        out.append(to);
        pos = hit + from.size();
    }
    out.append(s.substr(pos));
    return out;
}

// Protobuf's wire format, just enough to switch off NormalizerSpec.add_dummy_prefix in a
// serialized ModelProto (the Debian package installs no header for SentencePiece's model
// proto). ModelProto field 3 is normalizer_spec; NormalizerSpec field 3 is add_dummy_prefix.
constexpr uint64_t kNormalizerSpecField = 3, kAddDummyPrefixField = 3;
constexpr uint64_t kWireVarint = 0, kWire64 = 1, kWireBytes = 2, kWire32 = 5;

bool read_varint(std::string_view b, size_t& pos, uint64_t& value) {
    value = 0;
    for (int shift = 0; shift < 64 && pos < b.size(); shift += 7) {
        const auto byte = static_cast<uint8_t>(b[pos++]);
        value |= uint64_t{byte & 0x7Fu} << shift;
        if (!(byte & 0x80)) return true;
    }
    return false;
}

void write_varint(uint64_t value, std::string& out) {
    while (value >= 0x80) {
        out.push_back(static_cast<char>(0x80 | (value & 0x7F)));
        value >>= 7;
    }
    out.push_back(static_cast<char>(value));
}

struct ProtoField {
    uint64_t number = 0, wire_type = 0, varint = 0;
    std::string_view whole;    // tag and value, as serialized
    std::string_view payload;  // kWireBytes: the bytes
};

// The fields of a serialized message, or nullopt when it is not valid wire format.
std::optional<std::vector<ProtoField>> proto_fields(std::string_view msg) {
    std::vector<ProtoField> fields;
    size_t pos = 0;
    while (pos < msg.size()) {
        ProtoField f;
        const size_t start = pos;
        uint64_t tag = 0;
        if (!read_varint(msg, pos, tag)) return std::nullopt;
        f.number = tag >> 3;
        f.wire_type = tag & 7;
        uint64_t size = 0;
        switch (f.wire_type) {
            case kWireVarint:
                if (!read_varint(msg, pos, f.varint)) return std::nullopt;
                break;
            case kWire64:
            case kWire32:
                size = f.wire_type == kWire64 ? 8 : 4;
                if (msg.size() - pos < size) return std::nullopt;
                pos += size;
                break;
            case kWireBytes:
                if (!read_varint(msg, pos, size) || msg.size() - pos < size) return std::nullopt;
                f.payload = msg.substr(pos, size);
                pos += size;
                break;
            default:
                return std::nullopt;  // groups: not in SentencePiece's model
        }
        f.whole = msg.substr(start, pos - start);
        fields.push_back(f);
    }
    return fields;
}

// `model` with add_dummy_prefix false, and whether it was true; nullopt when it does not parse.
std::optional<std::string> without_dummy_prefix(std::string_view model, bool& had_prefix) {
    const auto fields = proto_fields(model);
    if (!fields) return std::nullopt;
    had_prefix = true;  // protobuf's default for the field
    std::string out;
    bool spec_seen = false;
    auto append_spec = [&](std::string spec) {
        write_varint(kAddDummyPrefixField << 3 | kWireVarint, spec);
        write_varint(0, spec);
        write_varint(kNormalizerSpecField << 3 | kWireBytes, out);
        write_varint(spec.size(), out);
        out += spec;
    };
    for (const ProtoField& f : *fields) {
        if (f.number != kNormalizerSpecField || f.wire_type != kWireBytes) {
            out.append(f.whole);
            continue;
        }
        const auto spec_fields = proto_fields(f.payload);
        if (!spec_fields) return std::nullopt;
        std::string spec;
        for (const ProtoField& g : *spec_fields) {
            if (g.number == kAddDummyPrefixField && g.wire_type == kWireVarint)
                had_prefix = g.varint != 0;
            else
                spec.append(g.whole);
        }
        append_spec(std::move(spec));
        spec_seen = true;
    }
    if (!spec_seen) append_spec({});
    return out;
}

// The value of a varint field, or `fallback` where the message lacks it (protobuf's default).
uint64_t varint_field(const std::vector<ProtoField>& fields, uint64_t number, uint64_t fallback) {
    uint64_t value = fallback;
    for (const ProtoField& f : fields)  // the last occurrence wins, as protobuf reads it
        if (f.number == number && f.wire_type == kWireVarint) value = f.varint;
    return value;
}

std::string_view bytes_field(const std::vector<ProtoField>& fields, uint64_t number) {
    std::string_view value;
    for (const ProtoField& f : fields)
        if (f.number == number && f.wire_type == kWireBytes) value = f.payload;
    return value;
}

void encode_with(const sentencepiece::SentencePieceProcessor& sp, std::string_view text,
                 std::vector<int32_t>& out, const std::string& name) {
    static_assert(sizeof(int) == sizeof(int32_t));
    std::vector<int> ids;
    auto status = sp.Encode(text, &ids);
    if (!status.ok()) throw Error(name + ": cannot encode text: " + status.ToString());
    out.assign(ids.begin(), ids.end());
}

}  // namespace

// The processor for continuation pieces, made on first use.
struct Tokenizer::Continuation {
    std::once_flag once;
    bool adds_dummy_prefix = true;
    // The model without its dummy prefix; null when it has none, or when its bytes did not
    // parse (then continuations get a dummy prefix: the text still decodes the same, but for
    // a space at each such cut).
    std::unique_ptr<sentencepiece::SentencePieceProcessor> no_prefix;
};

// ---------------------------------------------------------------------------------------------
// Tokenizer

Tokenizer::Tokenizer()
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()),
      continuation_(std::make_unique<Continuation>()) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& path) {
    std::string file = path;
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
        file = checkpoint_tokenizer(path);
        if (file.empty())
            throw Error(path + ": no tokenizer.model or tokenizer.json in this directory");
    }
    if (!fs::exists(file, ec))
        throw Error(file +
                    ": tokenizer not found (expected a SentencePiece .model file or a "
                    "tokenizer.json)");
    const std::string bytes = read_file(file);
    if (!is_tokenizer_json(file, bytes)) return from_bytes(bytes, file);
    // The files a checkpoint carries with it (model/checkpoint.h's tokenizer_files).
    const fs::path config = fs::path(file).parent_path() / "tokenizer_config.json";
    const bool has_config = fs::is_regular_file(config, ec);
    return from_json(bytes, has_config ? read_file(config.string()) : "", file);
}

Tokenizer Tokenizer::from_bytes(std::string_view model_bytes, const std::string& name) {
    Tokenizer t;
    t.path_ = name;
    // SentencePiece throws from inside its trie builder on some malformed models (an empty
    // piece): that is a bad file too, not a crash.
    sentencepiece::util::Status status;
    try {
        status = t.sp_->LoadFromSerializedProto(model_bytes);
    } catch (const std::exception& e) {
        throw Error(name + ": not a valid SentencePiece model (" + e.what() + ")");
    }
    if (!status.ok())
        throw Error(name + ": not a valid SentencePiece model (" + status.ToString() + ")");
    const int n = t.sp_->GetPieceSize();
    if (n <= 0) throw Error(name + ": SentencePiece model has no pieces");
    t.info_.resize(static_cast<size_t>(n));
    for (int id = 0; id < n; ++id) {
        PieceInfo& pi = t.info_[static_cast<size_t>(id)];
        const std::string& piece = t.sp_->IdToPiece(id);
        if (t.sp_->IsControl(id)) {
            pi.kind = Kind::Control;
        } else if (t.sp_->IsUnknown(id)) {
            pi.kind = Kind::Unknown;
            pi.text = t.sp_->DecodeIds({id});  // the unk surface, e.g. " ⁇ "
        } else if (t.sp_->IsByte(id) && piece.size() == 6 && piece.rfind("<0x", 0) == 0 &&
                   hex_value(piece[3]) >= 0 && hex_value(piece[4]) >= 0 && piece[5] == '>') {
            pi.kind = Kind::Byte;
            pi.byte = static_cast<uint8_t>(hex_value(piece[3]) * 16 + hex_value(piece[4]));
        } else {
            pi.kind = Kind::Normal;
            pi.leading_space = piece.rfind(kSpaceSymbol, 0) == 0;
            pi.text = replace_all(piece, kSpaceSymbol, " ");
        }
    }
    return t;
}

namespace {

// A special token of tokenizer_config.json: "<s>", {"content": "<s>", ...} or null.
std::string config_token(const nlohmann::json& cfg, const char* key, const std::string& name) {
    if (!cfg.contains(key) || cfg.at(key).is_null()) return "";
    const nlohmann::json& v = cfg.at(key);
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v.at("content").is_string())
        return v.at("content").get<std::string>();
    throw Error(name + ": field '" + key + "': expected a token (a string or {\"content\": ...})");
}

}  // namespace

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json,
                               const std::string& name) {
    Tokenizer t;
    t.sp_.reset();
    t.path_ = name;
    t.json_ = TokenizerJson::parse(tokenizer_json, name);
    if (t.json_->vocab_size() <= 0) throw Error(name + ": the tokenizer has no tokens");
    if (!config_json.empty()) {
        const std::string config_name =
            (fs::path(name).parent_path() / "tokenizer_config.json").string();
        nlohmann::json cfg;
        try {
            cfg = nlohmann::json::parse(config_json);
        } catch (const nlohmann::json::exception& e) {
            throw Error(config_name + ": not valid JSON (" + e.what() + ")");
        }
        if (!cfg.is_object()) throw Error(config_name + ": expected a JSON object");
        const auto id_of = [&](const char* key) -> int32_t {
            const std::string token = config_token(cfg, key, config_name);
            if (token.empty()) return -1;
            const int32_t id = t.json_->id_of(token);
            if (id < 0)
                throw Error(config_name + ": field '" + key + "': token '" + token +
                            "' is not in " + name);
            return id;
        };
        t.json_bos_ = id_of("bos_token");
        t.json_eos_ = id_of("eos_token");
        t.json_pad_ = id_of("pad_token");
        // A tokenizer that says it adds no BOS: tmx puts none before a text either.
        if (cfg.contains("add_bos_token") && cfg.at("add_bos_token").is_boolean() &&
            !cfg.at("add_bos_token").get<bool>())
            t.json_bos_ = -1;
    }
    const int32_t n = t.json_->vocab_size();
    t.info_.resize(static_cast<size_t>(n));
    for (int32_t id = 0; id < n; ++id) {
        PieceInfo& pi = t.info_[static_cast<size_t>(id)];
        const TokenizerJson::Piece p = t.json_->piece(id);
        if (id == t.json_->unk_id()) {
            pi.kind = Kind::Unknown;
            pi.text = t.json_->decode({id});
        } else if (p.kind == TokenizerJson::Piece::Kind::Special) {
            pi.kind = Kind::Control;
        } else if (p.kind == TokenizerJson::Piece::Kind::Bytes && t.json_->is_byte_fallback(id)) {
            pi.kind = Kind::Byte;
            pi.byte = static_cast<uint8_t>(p.text[0]);
        } else if (p.kind == TokenizerJson::Piece::Kind::Bytes) {
            pi.kind = Kind::Bytes;
            pi.text = p.text;
        } else {
            pi.kind = Kind::Normal;
            pi.leading_space = p.strip_first_space && !p.text.empty() && p.text[0] == ' ';
            pi.text = p.text;
        }
    }
    return t;
}

int32_t Tokenizer::vocab_size() const {
    return sp_ ? sp_->GetPieceSize() : json_->vocab_size();
}
int32_t Tokenizer::bos_id() const {
    return sp_ ? sp_->bos_id() : json_bos_;
}
int32_t Tokenizer::eos_id() const {
    return sp_ ? sp_->eos_id() : json_eos_;
}
int32_t Tokenizer::unk_id() const {
    return sp_ ? sp_->unk_id() : json_->unk_id();
}
int32_t Tokenizer::pad_id() const {
    return sp_ ? sp_->pad_id() : json_pad_;
}

void Tokenizer::check_id(int32_t id) const {
    if (id < 0 || id >= vocab_size())
        throw Error("token id " + std::to_string(id) + " is out of range for tokenizer " + path_ +
                    " (vocab size " + std::to_string(vocab_size()) + ")");
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
    std::vector<int32_t> ids;
    encode(text, ids);
    return ids;
}

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
    if (json_)
        json_->encode(text, false, out);
    else
        encode_with(*sp_, text, out, path_);
}

std::vector<int32_t> Tokenizer::encode_with_special_tokens(std::string_view text) const {
    if (json_) return encode(text);
    // The control pieces, longest first, matched leftmost.
    std::vector<int32_t> specials;
    for (int32_t id = 0; id < vocab_size(); ++id)
        if (is_control(id) && !piece(id).empty()) specials.push_back(id);
    std::sort(specials.begin(), specials.end(),
              [&](int32_t a, int32_t b) { return piece(a).size() > piece(b).size(); });
    std::vector<int32_t> out, part;
    size_t start = 0;
    const auto flush = [&](size_t end) {
        if (end > start) {
            encode(text.substr(start, end - start), part);
            out.insert(out.end(), part.begin(), part.end());
        }
    };
    for (size_t i = 0; i < text.size();) {
        const auto hit = std::find_if(specials.begin(), specials.end(), [&](int32_t id) {
            return text.substr(i).starts_with(piece(id));
        });
        if (hit == specials.end()) {
            ++i;
            continue;
        }
        flush(i);
        out.push_back(*hit);
        i += piece(*hit).size();
        start = i;
    }
    flush(text.size());
    return out;
}

void Tokenizer::encode_continuation(std::string_view text, std::vector<int32_t>& out) const {
    if (json_) {
        json_->encode(text, true, out);
        return;
    }
    Continuation& c = *continuation_;
    std::call_once(c.once, [&] {
        const auto model = without_dummy_prefix(sp_->serialized_model_proto(), c.adds_dummy_prefix);
        if (!model || !c.adds_dummy_prefix) return;
        auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
        try {
            if (sp->LoadFromSerializedProto(*model).ok()) c.no_prefix = std::move(sp);
        } catch (const std::exception&) {  // as from_bytes: then continuations get the prefix
        }
    });
    if (c.adds_dummy_prefix && !text.empty() && text.front() == ' ')
        encode(text.substr(1), out);  // the dummy prefix stands for the piece's first space
    else
        encode_with(c.no_prefix ? *c.no_prefix : *sp_, text, out, path_);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
    std::vector<int> v(ids.begin(), ids.end());
    for (int id : v) check_id(id);
    if (json_) return json_->decode(ids);
    std::string text;
    auto status = sp_->Decode(v, &text);
    if (!status.ok()) throw Error(path_ + ": cannot decode ids: " + status.ToString());
    return text;
}

const std::string& Tokenizer::piece(int32_t id) const {
    check_id(id);
    return sp_ ? sp_->IdToPiece(id) : json_->token(id);
}

bool Tokenizer::is_control(int32_t id) const {
    return info(id).kind == Kind::Control;
}
bool Tokenizer::is_byte(int32_t id) const {
    return info(id).kind == Kind::Byte;
}
bool Tokenizer::is_unknown(int32_t id) const {
    return info(id).kind == Kind::Unknown;
}

int32_t Tokenizer::byte_pieces() const {
    int32_t n = 0;
    for (const auto& pi : info_) n += pi.kind == Kind::Byte;
    return n;
}

bool Tokenizer::is_unused(int32_t id) const {
    check_id(id);
    return sp_ && sp_->IsUnused(id);
}

float Tokenizer::score(int32_t id) const {
    check_id(id);
    return sp_ ? sp_->GetScore(id) : 0.0f;  // a tokenizer.json ranks merges, not pieces
}

// Field numbers of sentencepiece_model.proto: ModelProto {pieces 1, trainer_spec 2,
// normalizer_spec 3, denormalizer_spec 5}; SentencePiece {type 3}; TrainerSpec {model_type 3,
// treat_whitespace_as_suffix 24, byte_fallback 35}; NormalizerSpec {name 1,
// precompiled_charsmap 2, add_dummy_prefix 3, remove_extra_whitespaces 4,
// escape_whitespaces 5}.
Tokenizer::ModelSpec Tokenizer::model_spec() const {
    if (!sp_) throw Error(path_ + ": a tokenizer.json, not a SentencePiece model");
    const std::string model = sp_->serialized_model_proto();
    const auto fail = [&]() -> Error {
        return Error(path_ + ": the SentencePiece model's spec does not parse");
    };
    const auto fields = proto_fields(model);
    if (!fields) throw fail();
    const auto message = [&](uint64_t number) {
        const auto sub = proto_fields(bytes_field(*fields, number));
        if (!sub) throw fail();
        return *sub;
    };
    ModelSpec spec;
    const auto trainer = message(2), normalizer = message(3), denormalizer = message(5);
    spec.type = static_cast<ModelSpec::Type>(varint_field(trainer, 3, 1));
    spec.treat_whitespace_as_suffix = varint_field(trainer, 24, 0) != 0;
    spec.byte_fallback = varint_field(trainer, 35, 0) != 0;
    spec.normalizer = std::string(bytes_field(normalizer, 1));
    spec.has_charsmap = !bytes_field(normalizer, 2).empty();
    spec.has_denormalizer = !bytes_field(denormalizer, 2).empty();
    spec.add_dummy_prefix = varint_field(normalizer, 3, 1) != 0;
    spec.remove_extra_whitespaces = varint_field(normalizer, 4, 1) != 0;
    spec.escape_whitespaces = varint_field(normalizer, 5, 1) != 0;
    int32_t id = 0;
    constexpr uint64_t kUserDefined = 4, kUnused = 5;
    for (const ProtoField& f : *fields) {
        if (f.number != 1 || f.wire_type != kWireBytes) continue;
        const auto piece = proto_fields(f.payload);
        if (!piece) throw fail();
        const uint64_t type = varint_field(*piece, 3, 1);
        if (type == kUserDefined) spec.user_defined.push_back(id);
        if (type == kUnused) spec.unused.push_back(id);
        ++id;
    }
    return spec;
}

const Tokenizer::PieceInfo& Tokenizer::info(int32_t id) const {
    check_id(id);
    return info_[static_cast<size_t>(id)];
}

// ---------------------------------------------------------------------------------------------
// StreamDecoder: mirrors SentencePiece's decoder. A run of byte pieces is decoded as UTF-8 with
// one U+FFFD per invalid byte; any other piece ends the run. The first non-control piece loses
// one leading "▁" (the dummy prefix the encoder added).

std::string StreamDecoder::push(int32_t id) {
    std::string out;
    push(id, out);
    return out;
}

void StreamDecoder::push(int32_t id, std::string& out) {
    const Tokenizer::PieceInfo& pi = tok_->info(id);
    using Kind = Tokenizer::Kind;
    if (pi.kind == Kind::Byte || pi.kind == Kind::Bytes) {
        at_start_ = false;
        if (pi.kind == Kind::Byte)
            pending_.push_back(static_cast<char>(pi.byte));
        else
            pending_ += pi.text;
        drain(out, false);
        return;
    }
    drain(out, true);
    if (pi.kind == Kind::Control) return;
    if (pi.kind == Kind::Normal && at_start_ && pi.leading_space)
        out.append(pi.text, 1);
    else
        out.append(pi.text);
    at_start_ = false;
}

std::string StreamDecoder::flush() {
    std::string out;
    drain(out, true);
    return out;
}

void StreamDecoder::reset() {
    pending_.clear();
    at_start_ = true;
}

void StreamDecoder::drain(std::string& out, bool final) {
    size_t i = 0;
    const size_t n = pending_.size();
    while (i < n) {
        std::string_view rest(pending_.data() + i, n - i);
        size_t len = utf8_char_length(rest);
        if (len > 0) {
            out.append(rest.substr(0, len));
            i += len;
        } else if (!final && is_incomplete_utf8(rest)) {
            break;  // wait for the rest of the character
        } else {
            out.append(kReplacementChar);
            i += 1;
        }
    }
    pending_.erase(0, i);
}

// ---------------------------------------------------------------------------------------------
// Training

namespace {

// Feeds SentencePiece the non-blank lines of the corpus documents, streaming the files.
class CorpusSentenceIterator : public sentencepiece::SentenceIterator {
  public:
    CorpusSentenceIterator(const std::vector<std::string>& inputs,
                           const TokenizerTrainOptions& options)
        : reader_(inputs, CorpusReaderOptions{options.format, size_t{16} << 20}),
          progress_(options.progress) {
        advance();
    }

    bool done() const override { return done_; }
    void Next() override { advance(); }
    const std::string& value() const override { return value_; }
    sentencepiece::util::Status status() const override {
        if (error_)
            return sentencepiece::util::Status(sentencepiece::util::StatusCode::kAborted,
                                               "reading the corpus failed");
        return {};
    }

    std::exception_ptr error() const { return error_; }
    int64_t sentences() const { return sentences_; }
    CorpusStats corpus_stats() const { return reader_.stats(); }

  private:
    void advance() {
        if (done_) return;
        try {
            while (true) {
                while (doc_ < docs_.size()) {
                    const std::string& d = docs_[doc_];
                    while (pos_ < d.size()) {
                        size_t end = d.find('\n', pos_);
                        if (end == std::string::npos) end = d.size();
                        std::string_view line(d.data() + pos_, end - pos_);
                        pos_ = end + 1;
                        if (line.find_first_not_of(" \t\r\v\f") == std::string_view::npos) continue;
                        value_.assign(line);
                        ++sentences_;
                        return;
                    }
                    ++doc_;
                    pos_ = 0;
                }
                docs_.clear();
                doc_ = pos_ = 0;
                if (!reader_.next(docs_)) {
                    done_ = true;
                    return;
                }
                if (progress_) progress_(reader_.bytes_read(), reader_.total_bytes());
            }
        } catch (...) {
            error_ = std::current_exception();
            done_ = true;
        }
    }

    CorpusReader reader_;
    std::function<void(uint64_t, uint64_t)> progress_;
    std::vector<std::string> docs_;
    size_t doc_ = 0, pos_ = 0;
    std::string value_;
    bool done_ = false;
    std::exception_ptr error_;
    int64_t sentences_ = 0;
};

std::string join_paths(const std::vector<std::string>& paths) {
    std::string s;
    for (size_t i = 0; i < paths.size(); ++i) s += (i ? ", " : "") + paths[i];
    return s;
}

}  // namespace

TokenizerTrainReport train_tokenizer(const std::vector<std::string>& inputs, int vocab_size,
                                     const std::string& out_path,
                                     const TokenizerTrainOptions& options) {
    const auto t0 = std::chrono::steady_clock::now();
    if (inputs.empty()) throw Error("no input files given to train the tokenizer on");
    if (vocab_size <= 0)
        throw UsageError("vocabulary size must be positive, got " + std::to_string(vocab_size));
    if (options.max_sentences <= 0)
        throw UsageError("the number of sampled sentences must be positive");
    std::error_code ec;
    if (fs::exists(out_path, ec)) {
        if (fs::is_directory(out_path, ec))
            throw Error(out_path + ": is a directory; give the path of the .model file to write");
        if (!options.overwrite)
            throw Error(out_path + ": already exists (use " + opt("overwrite") + " to replace it)");
    }

    CorpusSentenceIterator it(inputs, options);
    std::unordered_map<std::string, std::string> args = {
        {"model_type", "bpe"},
        {"vocab_size", std::to_string(vocab_size)},
        {"byte_fallback", "true"},
        {"split_digits", "true"},
        {"unk_id", "0"},
        {"bos_id", "1"},
        {"eos_id", "2"},
        {"pad_id", "-1"},
        {"normalization_rule_name", "identity"},
        {"remove_extra_whitespaces", "false"},
        {"add_dummy_prefix", "true"},
        {"allow_whitespace_only_pieces", "true"},
        {"character_coverage", std::to_string(options.character_coverage)},
        {"input_sentence_size", std::to_string(options.max_sentences)},
        {"shuffle_input_sentence", "true"},
        {"max_sentence_length", std::to_string(options.max_sentence_bytes)},
        {"num_threads", std::to_string(std::max(1, num_threads()))},
        {"minloglevel", options.verbose ? "0" : "2"},
    };
    sentencepiece::SetRandomGeneratorSeed(options.seed);
    std::string model;
    auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
    if (it.error()) std::rethrow_exception(it.error());
    if (!status.ok()) {
        const std::string msg = status.ToString();
        std::smatch m;
        if (std::regex_search(msg, m, std::regex(R"(Please set it to a value <= (\d+))"))) {
            const int64_t largest = std::stoll(m[1].str());
            throw VocabSizeError("vocabulary size " + std::to_string(vocab_size) +
                                     " is too large for this corpus (" + join_paths(inputs) +
                                     "); the largest that works is " + std::to_string(largest),
                                 vocab_size, largest, 0);
        }
        if (std::regex_search(msg, m,
                              std::regex(R"(smaller than required_chars\. \d+ vs (\d+))"))) {
            const int64_t smallest = std::stoll(m[1].str());
            throw VocabSizeError(
                "vocabulary size " + std::to_string(vocab_size) +
                    " is too small for this corpus (" + join_paths(inputs) +
                    "): the 256 byte pieces, 3 special pieces and its characters need at least " +
                    std::to_string(smallest) + " (or lower the character coverage)",
                vocab_size, 0, smallest);
        }
        throw Error("training the tokenizer on " + join_paths(inputs) + " failed: " + msg);
    }
    // Check what we are about to write, then write it atomically.
    Tokenizer check = Tokenizer::from_bytes(model, out_path);
    if (check.vocab_size() != vocab_size)
        throw Error(out_path + ": trained model has " + std::to_string(check.vocab_size()) +
                    " pieces, expected " + std::to_string(vocab_size));
    const fs::path parent = fs::path(out_path).parent_path();
    if (!parent.empty()) {
        fs::create_directories(parent, ec);
        if (ec) throw Error(parent.string() + ": cannot create directory: " + ec.message());
    }
    write_file_atomic(out_path, model);

    TokenizerTrainReport report;
    report.vocab_size = check.vocab_size();
    report.corpus = it.corpus_stats();
    report.sentences = it.sentences();
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return report;
}

}  // namespace tmx
