#include "engine/core/json_fields.h"

namespace tmx::json_fields {

using nlohmann::json;

std::string describe(const json& v) {
    std::string s = v.dump();
    if (s.size() > 40) s = s.substr(0, 37) + "...";
    return s;
}

void fail(const std::string& source, const std::string& field, const std::string& what) {
    throw Error(source + ": field '" + field + "': " + what);
}

int64_t as_int(const json& v, const std::string& source, const std::string& field,
               int64_t min_value) {
    const std::string expected = min_value == 0 ? "an integer >= 0"
                                 : min_value == std::numeric_limits<int64_t>::min()
                                     ? "an integer"
                                     : "an integer >= " + std::to_string(min_value);
    // nlohmann keeps integers up to 2^64 - 1 as unsigned; beyond int64_t they would wrap.
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        fail(source, field, "expected " + expected + " that fits in 64 bits, got " + describe(v));
    if (!v.is_number_integer() || v.get<int64_t>() < min_value)
        fail(source, field, "expected " + expected + ", got " + describe(v));
    return v.get<int64_t>();
}

uint64_t as_uint(const json& v, const std::string& source, const std::string& field) {
    if (!v.is_number_unsigned())
        fail(source, field, "expected an integer >= 0, got " + describe(v));
    return v.get<uint64_t>();
}

double as_number(const json& v, const std::string& source, const std::string& field) {
    if (!v.is_number()) fail(source, field, "expected a number, got " + describe(v));
    return v.get<double>();
}

bool as_bool(const json& v, const std::string& source, const std::string& field) {
    if (!v.is_boolean()) fail(source, field, "expected true or false, got " + describe(v));
    return v.get<bool>();
}

std::string as_string(const json& v, const std::string& source, const std::string& field) {
    if (!v.is_string()) fail(source, field, "expected a string, got " + describe(v));
    return v.get<std::string>();
}

Fields::Fields(const json& object, std::string source)
    : object_(object), source_(std::move(source)) {
    if (!object_.is_object())
        throw Error(source_ + ": expected a JSON object, got " + describe(object_));
}

const json& Fields::at(const std::string& field, const char* expected) const {
    auto it = object_.find(field);
    if (it == object_.end())
        fail(source_, field, std::string("missing (expected ") + expected + ")");
    return *it;
}

int64_t Fields::integer(const std::string& field, int64_t min_value) const {
    return as_int(at(field, min_value >= 0 ? "an integer >= 0" : "an integer"), source_, field,
                  min_value);
}
uint64_t Fields::uinteger(const std::string& field) const {
    return as_uint(at(field, "an integer >= 0"), source_, field);
}
double Fields::number(const std::string& field) const {
    return as_number(at(field, "a number"), source_, field);
}
bool Fields::boolean(const std::string& field) const {
    return as_bool(at(field, "true or false"), source_, field);
}
std::string Fields::string(const std::string& field) const {
    return as_string(at(field, "a string"), source_, field);
}

}  // namespace tmx::json_fields
