// The official OpenAI Node.js client (npm's `openai`, which scripts/test.sh installs into
// build/npm) against a running `tmx serve`: completions and chat, streamed and not, a prompt
// scored from token ids, structured output (response_format json_schema and json_object), and
// errors.
// Run by tests/apps/serve_cli_test.cpp with TMX_BASE_URL and TMX_OPENAI_PACKAGE set.
const assert = require('node:assert/strict');
const mod = require(process.env.TMX_OPENAI_PACKAGE);
const OpenAI = mod.OpenAI || mod.default || mod;

async function main() {
  const client = new OpenAI({ baseURL: process.env.TMX_BASE_URL, apiKey: 'sdk-key', maxRetries: 0 });

  const models = await client.models.list();
  assert.ok(models.data.length >= 1);
  const model = models.data[0].id;

  const request = { model, prompt: 'once upon a time', max_tokens: 12, seed: 9, temperature: 0.9 };
  const c = await client.completions.create(request);
  assert.equal(c.object, 'text_completion');
  assert.equal(c.choices.length, 1);
  assert.equal(typeof c.choices[0].text, 'string');
  assert.ok(['stop', 'length'].includes(c.choices[0].finish_reason));
  assert.equal(c.usage.total_tokens, c.usage.prompt_tokens + c.usage.completion_tokens);

  let streamed = '';
  for await (const chunk of await client.completions.create({ ...request, stream: true }))
    streamed += chunk.choices[0].text;
  assert.equal(streamed, c.choices[0].text);
  let usage = null;
  for await (const chunk of await client.completions.create(
    { ...request, stream: true, stream_options: { include_usage: true } }))
    if (chunk.usage) usage = chunk.usage;
  assert.deepEqual(usage, c.usage);

  const chatRequest = { model, messages: [{ role: 'user', content: 'tell me of the fox' }],
                        max_tokens: 8, seed: 4 };
  const chat = await client.chat.completions.create(chatRequest);
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.choices[0].message.role, 'assistant');
  let deltas = '';
  for await (const chunk of await client.chat.completions.create({ ...chatRequest, stream: true }))
    deltas += chunk.choices[0].delta.content || '';
  assert.equal(deltas, chat.choices[0].message.content);

  // Scoring a prompt given as token ids: echo with logprobs and no new token.
  const scored = await client.completions.create(
    { model, prompt: [5, 17, 42, 9], max_tokens: 0, echo: true, logprobs: 1, temperature: 0 });
  const lp = scored.choices[0].logprobs;
  assert.equal(lp.tokens.length, 4);
  assert.equal(lp.token_logprobs[0], null);
  assert.ok(lp.token_logprobs.slice(1).every((v) => typeof v === 'number' && v <= 0));
  assert.equal(scored.usage.completion_tokens, 0);

  await assert.rejects(
    client.completions.create({ model, prompt: 'x', max_tokens: 1e9 }),
    (e) => e.status === 400 && e.param === 'max_tokens');

  // Structured output: a schema whose values are few, so that any model finishes it.
  const schema = {
    type: 'object',
    properties: { ok: { type: 'boolean' }, colour: { enum: ['red', 'green', null] } },
    required: ['ok', 'colour'],
    additionalProperties: false,
  };
  const structured = await client.chat.completions.create({
    ...chatRequest, max_tokens: 64, n: 3, temperature: 1,
    response_format: { type: 'json_schema', json_schema: { name: 'answer', schema, strict: true } },
  });
  for (const choice of structured.choices) {
    assert.equal(choice.finish_reason, 'stop');
    const value = JSON.parse(choice.message.content);
    assert.deepEqual(Object.keys(value), ['ok', 'colour']);
    assert.equal(typeof value.ok, 'boolean');
    assert.ok(['red', 'green', null].includes(value.colour));
  }
  const object = await client.completions.create(
    { ...request, max_tokens: 48, response_format: { type: 'json_object' } });
  const text = object.choices[0].text;
  if (object.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(text), 'object');
  else assert.ok(text.startsWith('{') || text.startsWith(' {') || text.startsWith('\n{'), text);
  await assert.rejects(
    client.chat.completions.create({
      ...chatRequest,
      response_format: {
        type: 'json_schema',
        json_schema: { name: 'n', schema: { type: 'string', pattern: '^a' } },
      },
    }),
    (e) => e.status === 400 && e.param === 'response_format.json_schema.schema.pattern');
  console.log('openai sdk: ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
