// One reader of JSON fields for every file tmx reads (configs, trainer state, dataset meta,
// parameter reports): typed getters whose errors name the file, the field, what was expected and
// what was found, as "SOURCE: field 'FIELD': expected an integer, got \"16\"".
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/errors.h"

namespace tmx::json_fields {

// Parses JSON text, refusing a key that appears twice in one object (parsers keep one of the
// two silently): "SOURCE: key 'PATH' appears twice", or "SOURCE: not valid JSON: ...".
nlohmann::json parse_unique_keys(std::string_view text, const std::string& source);

// A value as a message shows it: its JSON text, cut to 40 characters.
std::string describe(const nlohmann::json& v);

// Throws tmx::Error "SOURCE: field 'FIELD': WHAT".
[[noreturn]] void fail(const std::string& source, const std::string& field,
                       const std::string& what);

// One value of the named field, of the type asked for. as_int takes integers from min_value to
// max_value; as_uint non-negative integers that fit in uint64_t.
int64_t as_int(const nlohmann::json& v, const std::string& source, const std::string& field,
               int64_t min_value = std::numeric_limits<int64_t>::min(),
               int64_t max_value = std::numeric_limits<int64_t>::max());
// as_int that also takes a number whose fraction is zero (4096.0), as configs written from
// Python floats have; magnitudes from 9e15 up are refused (a double no longer holds each integer).
int64_t as_whole_number(const nlohmann::json& v, const std::string& source,
                        const std::string& field);
uint64_t as_uint(const nlohmann::json& v, const std::string& source, const std::string& field);
double as_number(const nlohmann::json& v, const std::string& source, const std::string& field);
bool as_bool(const nlohmann::json& v, const std::string& source, const std::string& field);
std::string as_string(const nlohmann::json& v, const std::string& source, const std::string& field);
std::vector<std::string> as_string_list(const nlohmann::json& v, const std::string& source,
                                        const std::string& field);

// A string naming one of `choices`.
template <typename E>
E as_enum(const nlohmann::json& v, const std::string& source, const std::string& field,
          const std::map<std::string, E>& choices) {
    std::string names;
    for (const auto& [name, value] : choices)
        names += (names.empty() ? "\"" : ", \"") + name + "\"";
    if (v.is_string()) {
        auto it = choices.find(v.get<std::string>());
        if (it != choices.end()) return it->second;
    }
    fail(source, field, "expected one of " + names + ", got " + describe(v));
}

// The fields of one JSON object, required: a missing one is an error saying what was expected.
class Fields {
  public:
    // Throws when `object` is not a JSON object. `path` prefixes the field names in messages
    // when the object is nested ("splits.train.").
    Fields(const nlohmann::json& object, std::string source, std::string path = "");

    bool has(const std::string& field) const { return object_.contains(field); }
    const nlohmann::json& at(const std::string& field, const char* expected) const;

    int64_t integer(const std::string& field,
                    int64_t min_value = std::numeric_limits<int64_t>::min(),
                    int64_t max_value = std::numeric_limits<int64_t>::max()) const;
    uint64_t uinteger(const std::string& field) const;
    double number(const std::string& field) const;
    bool boolean(const std::string& field) const;
    std::string string(const std::string& field) const;
    std::vector<std::string> string_list(const std::string& field) const;
    const std::string& source() const { return source_; }

  private:
    std::string name(const std::string& field) const { return path_ + field; }

    const nlohmann::json& object_;
    std::string source_, path_;
};

}  // namespace tmx::json_fields
