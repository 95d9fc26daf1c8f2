// Renders a chat template with Hugging Face's JavaScript Jinja (npm @huggingface/jinja, what
// transformers.js uses), for the tests that compare tmx's renderer with it.
// Usage: node jinja_render.cjs INPUT_JSON
// INPUT_JSON holds {"template": "...", "cases": [{variables}, ...]}; prints one JSON array with,
// per case, {"ok": "rendered text"} or {"error": "message"} (raise_exception's message as is).
//
// Two behaviours of @huggingface/jinja 0.5.11 differ from Jinja2, which transformers renders
// with, on real templates; this client corrects them, so that the comparison is with Jinja2's
// semantics (tests/clients/jinja2_render.py checks the same cases against Jinja2 itself):
//  - str.strip/lstrip/rstrip ignore their argument (Qwen3's `content.lstrip('\n')` strips
//    spaces too): here they strip the given characters, as Python's do;
//  - == and != compare with JavaScript's loose equality (Llama 2's `system_message != false`
//    is false for a blank system message, so it is dropped): here values of different types are
//    unequal, except numbers and booleans, as in Python.
const fs = require('fs');
const path = require('path');

const packageDir = process.env.TMX_JINJA_PACKAGE;
if (!packageDir) throw new Error('set TMX_JINJA_PACKAGE to the npm @huggingface/jinja package');
const { Template, Interpreter, Environment } = require(path.resolve(packageDir));

// The runtime's value classes are not exported; a value evaluated from a literal leads to them.
const sample = new Interpreter(new Environment()).evaluate(
    { type: 'StringLiteral', value: '' }, new Environment());
const stringProto = Object.getPrototypeOf(sample);
const builtins = Object.getOwnPropertyDescriptor(stringProto, 'builtins').get;

function pyStrip(text, chars, left, right) {
  const set = Array.from(chars);
  const cps = Array.from(text);
  let begin = 0, end = cps.length;
  while (left && begin < end && set.includes(cps[begin])) ++begin;
  while (right && end > begin && set.includes(cps[end - 1])) --end;
  return cps.slice(begin, end).join('');
}

Object.defineProperty(stringProto, 'builtins', {
  get() {
    const methods = builtins.call(this);
    if (methods.pythonStrip) return methods;
    for (const [name, left, right] of [['strip', 1, 1], ['lstrip', 1, 0], ['rstrip', 0, 1]]) {
      const original = methods.get(name);
      methods.set(name, new original.constructor((args) => {
        if (args.length === 0 || args[0].type === 'NullValue') return original.value(args);
        return new this.constructor(pyStrip(this.value, args[0].value, left, right));
      }));
    }
    methods.pythonStrip = true;
    return methods;
  },
});

const NUMERIC = new Set(['IntegerValue', 'FloatValue', 'BooleanValue']);
function pyEqual(a, b) {
  if (NUMERIC.has(a.type) && NUMERIC.has(b.type)) return Number(a.value) === Number(b.value);
  const kind = (v) => (v.type === 'TupleValue' ? 'ArrayValue' : v.type);
  if (kind(a) !== kind(b)) return false;
  if (kind(a) === 'ArrayValue')
    return a.value.length === b.value.length && a.value.every((x, i) => pyEqual(x, b.value[i]));
  if (a.type === 'ObjectValue')
    return a.value.size === b.value.size &&
        [...a.value].every(([k, v]) => b.value.has(k) && pyEqual(v, b.value.get(k)));
  return a.value === b.value;
}
const binary = Interpreter.prototype.evaluateBinaryExpression;
Interpreter.prototype.evaluateBinaryExpression = function (node, env) {
  const result = binary.call(this, node, env);
  const op = node.operator.value;
  if (op === '==' || op === '!=') {
    const equal = pyEqual(this.evaluate(node.left, env), this.evaluate(node.right, env));
    result.value = op === '==' ? equal : !equal;
  }
  return result;
};

const input = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const template = new Template(input.template);
const out = input.cases.map((variables) => {
  try {
    return { ok: template.render(variables) };
  } catch (e) {
    return { error: String(e.message) };
  }
});
process.stdout.write(JSON.stringify(out) + '\n');
