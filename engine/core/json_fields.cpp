#include "engine/core/json_fields.h"

#include <cmath>
#include <set>
#include <vector>

namespace tmx::json_fields {

using nlohmann::json;

json parse_unique_keys(std::string_view text, const std::string& source) {
    std::vector<std::set<std::string>> keys_per_object;  // one set per open object
    std::vector<std::string> path;                       // the key of each open object
    std::string duplicate;
    auto on_event = [&](int, json::parse_event_t event, json& parsed) {
        if (event == json::parse_event_t::object_start) {
            keys_per_object.emplace_back();
            path.emplace_back();
        }
        if (event == json::parse_event_t::object_end) {
            keys_per_object.pop_back();
            path.pop_back();
        }
        if (event == json::parse_event_t::key && duplicate.empty()) {
            const std::string& key = parsed.get_ref<const std::string&>();
            path.back() = key;
            if (!keys_per_object.back().insert(key).second) {
                for (const std::string& k : path) duplicate += (duplicate.empty() ? "" : ".") + k;
            }
        }
        return true;
    };
    json j;
    try {
        j = json::parse(text.begin(), text.end(), on_event);
    } catch (const json::exception& e) {
        throw Error(source + ": not valid JSON: " + e.what());
    }
    if (!duplicate.empty()) throw Error(source + ": key '" + duplicate + "' appears twice");
    return j;
}

std::string describe(const json& v) {
    std::string s = v.dump();
    if (s.size() > 40) s = s.substr(0, 37) + "...";
    return s;
}

void fail(const std::string& source, const std::string& field, const std::string& what) {
    throw Error(source + ": field '" + field + "': " + what);
}

namespace {

std::string integer_range_text(int64_t min_value, int64_t max_value) {
    constexpr int64_t lowest = std::numeric_limits<int64_t>::min();
    constexpr int64_t highest = std::numeric_limits<int64_t>::max();
    if (max_value != highest)
        return "an integer from " + std::to_string(min_value) + " to " + std::to_string(max_value);
    if (min_value == lowest) return "an integer";
    return "an integer >= " + std::to_string(min_value);
}

}  // namespace

int64_t as_int(const json& v, const std::string& source, const std::string& field,
               int64_t min_value, int64_t max_value) {
    const std::string expected = integer_range_text(min_value, max_value);
    // nlohmann keeps integers up to 2^64 - 1 as unsigned; beyond int64_t they would wrap.
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        fail(source, field, "expected " + expected + " that fits in 64 bits, got " + describe(v));
    if (!v.is_number_integer() || v.get<int64_t>() < min_value || v.get<int64_t>() > max_value)
        fail(source, field, "expected " + expected + ", got " + describe(v));
    return v.get<int64_t>();
}

int64_t as_whole_number(const json& v, const std::string& source, const std::string& field) {
    if (v.is_number_float()) {
        const double d = v.get<double>();
        if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15)
            return static_cast<int64_t>(d);
        fail(source, field, "expected an integer, got " + describe(v));
    }
    return as_int(v, source, field);
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

std::vector<std::string> as_string_list(const json& v, const std::string& source,
                                        const std::string& field) {
    if (!v.is_array()) fail(source, field, "expected a list of strings, got " + describe(v));
    std::vector<std::string> out;
    out.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i)
        out.push_back(as_string(v[i], source, field + "[" + std::to_string(i) + "]"));
    return out;
}

Fields::Fields(const json& object, std::string source, std::string path)
    : object_(object), source_(std::move(source)), path_(std::move(path)) {
    if (!object_.is_object()) {
        if (path_.empty())
            throw Error(source_ + ": expected a JSON object, got " + describe(object_));
        fail(source_, path_.substr(0, path_.size() - 1),
             "expected a JSON object, got " + describe(object_));
    }
}

const json& Fields::at(const std::string& field, const char* expected) const {
    auto it = object_.find(field);
    if (it == object_.end())
        fail(source_, name(field), std::string("missing (expected ") + expected + ")");
    return *it;
}

int64_t Fields::integer(const std::string& field, int64_t min_value, int64_t max_value) const {
    const std::string expected = integer_range_text(min_value, max_value);
    return as_int(at(field, expected.c_str()), source_, name(field), min_value, max_value);
}
uint64_t Fields::uinteger(const std::string& field) const {
    return as_uint(at(field, "an integer >= 0"), source_, name(field));
}
double Fields::number(const std::string& field) const {
    return as_number(at(field, "a number"), source_, name(field));
}
bool Fields::boolean(const std::string& field) const {
    return as_bool(at(field, "true or false"), source_, name(field));
}
std::string Fields::string(const std::string& field) const {
    return as_string(at(field, "a string"), source_, name(field));
}
std::vector<std::string> Fields::string_list(const std::string& field) const {
    return as_string_list(at(field, "a list of strings"), source_, name(field));
}

}  // namespace tmx::json_fields
