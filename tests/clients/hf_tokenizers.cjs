// Encodes and decodes texts with Hugging Face's own `tokenizers` library (npm `tokenizers`, the
// Rust library transformers uses) from a tokenizer.json, for the tests that compare tmx's
// tokenizer with it. Usage: node hf_tokenizers.cjs TOKENIZER_JSON TEXTS_JSON
// TEXTS_JSON holds {"texts": [...], "ids": [[...], ...]}; prints one JSON object:
// {"encoded": [[ids without special tokens], ...], "decoded": [text of each ids list, ...]}.
const fs = require('fs');
const path = require('path');

const packageDir = process.env.TMX_TOKENIZERS_PACKAGE;
if (!packageDir) throw new Error('set TMX_TOKENIZERS_PACKAGE to the npm tokenizers package');
const { Tokenizer } = require(path.resolve(packageDir));

async function main() {
  const [tokenizerPath, textsPath] = process.argv.slice(2);
  const tokenizer = Tokenizer.fromFile(tokenizerPath);
  const input = JSON.parse(fs.readFileSync(textsPath, 'utf8'));
  const encoded = [];
  for (const text of input.texts) {
    const e = await tokenizer.encode(text, null, { addSpecialTokens: false });
    encoded.push(Array.from(e.getIds()));
  }
  const withSpecial = [];
  for (const text of input.texts) {
    const e = await tokenizer.encode(text, null, { addSpecialTokens: true });
    withSpecial.push(Array.from(e.getIds()));
  }
  const decoded = [];
  for (const ids of input.ids) decoded.push(await tokenizer.decode(ids, true));
  process.stdout.write(JSON.stringify({ encoded, with_special: withSpecial, decoded }) + '\n');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
