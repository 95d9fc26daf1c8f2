// Schemas and values for the structured-output tests: hand-picked schemas, random schemas of
// the subset engine/infer/json_schema.h compiles, random texts valid under a schema (written as
// that header says texts are written), and a validator written from the JSON Schema
// specification (not from the compiler) for the checks that do without npm's ajv.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/rng.h"

namespace tmx::test {

using ojson = nlohmann::ordered_json;

// Schemas a program asks for: records with optional fields, enums, lists with bounds, nested
// objects, anyOf with null, a bare type list, `$defs` and `$ref` as Pydantic writes them, a
// recursive tree.
std::vector<ojson> sample_schemas();

// A random schema of the supported subset, objects and arrays nested up to `depth` levels;
// some with subschemas moved into `$defs`/`definitions` behind `$ref`, and a recursive one.
ojson random_schema(Rng& rng, int depth = 3);

// A random text valid under `schema`, with random whitespace where the automaton allows it.
std::string random_valid_text(const ojson& schema, Rng& rng);

// Whether `value` is valid under `schema` (type, enum, const, properties, required,
// additionalProperties, items, minItems, maxItems, anyOf, local $ref).
bool validates(const nlohmann::json& value, const ojson& schema);

}  // namespace tmx::test
