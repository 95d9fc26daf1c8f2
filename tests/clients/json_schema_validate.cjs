// npm's ajv (8, JSON Schema draft-07; scripts/test.sh installs it into build/npm) validating
// texts against schemas: the validator tmx's structured output is checked with, written by
// others. Reads a JSON file (argv[2]): [{"schema": {...}, "texts": ["...", ...]}, ...]; prints
// one JSON array per case, each text's null when it parses and validates, else why not.
// Run by tests/apps/serve_structured_output_test.cpp with TMX_AJV_PACKAGE set.
const fs = require('node:fs');
const mod = require(process.env.TMX_AJV_PACKAGE);
const Ajv = mod.default || mod;

const ajv = new Ajv({ allErrors: true, strict: false });
const cases = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const results = cases.map(({ schema, texts }) => {
  const validate = ajv.compile(schema);
  return texts.map((text) => {
    let value;
    try {
      value = JSON.parse(text);
    } catch (e) {
      return `not JSON: ${e.message}`;
    }
    return validate(value) ? null : ajv.errorsText(validate.errors);
  });
});
console.log(JSON.stringify(results));
