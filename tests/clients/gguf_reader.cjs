// An outside reader of `tmx export --format gguf`: npm's @huggingface/gguf (which scripts/test.sh
// installs into build/npm) parses the file's header (metadata, tensor names, shapes, types,
// offsets), and every tensor's F32 data, read at the offsets it reports, is checked against the
// checkpoint's own weights (its model.safetensors, read here too) under llama.cpp's layout:
// names and dims as llama.cpp's converter writes them, the experts stacked, and the rows of
// attn_q / attn_k reordered per head as the converter's `permute` does. Round trips through
// tmx cannot see a mistake in that order (the import undoes what the export did); this can.
// Usage: TMX_GGUF_PACKAGE=.../node_modules/@huggingface/gguf node gguf_reader.cjs FILE.gguf CKPT
// Prints the header as JSON, then "gguf reader: ok".
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { gguf } = require(process.env.TMX_GGUF_PACKAGE);

const GGML_F32 = 0;

// A safetensors file: an 8-byte little-endian header length, the JSON header, then the data
// (each entry's data_offsets count from the end of the header).
function readSafetensors(file) {
  const bytes = fs.readFileSync(file);
  const headerLength = Number(bytes.readBigUInt64LE(0));
  const header = JSON.parse(bytes.subarray(8, 8 + headerLength).toString('utf8'));
  const base = 8 + headerLength;
  const tensors = new Map();
  for (const [name, entry] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    assert.equal(entry.dtype, 'F32', `${name}: the checkpoint is expected in f32`);
    const [begin, end] = entry.data_offsets;
    tensors.set(name, { shape: entry.shape, data: bytes.subarray(base + begin, base + end) });
  }
  return tensors;
}

// llama.cpp's convert_hf_to_gguf.py, LlamaModel.permute (n_head = n_head_kv for k_proj):
//   w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(w.shape)
// Written here as the index arithmetic of that view: the result's row (h, j, t) of the
// [n_head, rows/n_head/2, 2] view reads the source's row (h, t, j) of its [n_head, 2, ...] view.
function llamaCppPermute(rowBytes, rows, nHead) {
  const half = rows / nHead / 2;
  assert.ok(Number.isInteger(half), `rows ${rows} do not split into ${nHead} heads of pairs`);
  const out = [];
  for (let h = 0; h < nHead; ++h)
    for (let j = 0; j < half; ++j)
      for (let t = 0; t < 2; ++t) out.push(rowBytes((h * 2 + t) * half + j));
  return out;
}

// The tensors llama.cpp's `llama` architecture reads for a Mixtral, each with the checkpoint
// tensors it is made of, in order. Names are llama.cpp's (its tensor_mapping.py): dims are
// written fastest first, so a [out, in] matrix is [in, out] and the experts' [E, out, in] stack
// is [in, out, E].
function expectedTensors(c, weights) {
  const expected = [];
  const add = (name, sources, options = {}) => expected.push({ name, sources, ...options });
  add('token_embd.weight', ['model.embed_tokens.weight']);
  for (let i = 0; i < c.n_layers; ++i) {
    const p = `model.layers.${i}.`;
    const b = `blk.${i}.`;
    add(b + 'attn_norm.weight', [p + 'input_layernorm.weight']);
    add(b + 'attn_q.weight', [p + 'self_attn.q_proj.weight'], { ropeHeads: c.n_heads });
    add(b + 'attn_k.weight', [p + 'self_attn.k_proj.weight'], { ropeHeads: c.n_kv_heads });
    add(b + 'attn_v.weight', [p + 'self_attn.v_proj.weight']);
    add(b + 'attn_output.weight', [p + 'self_attn.o_proj.weight']);
    add(b + 'ffn_norm.weight', [p + 'post_attention_layernorm.weight']);
    if (c.n_experts > 0) {
      const m = p + 'block_sparse_moe.';
      add(b + 'ffn_gate_inp.weight', [m + 'gate.weight']);
      for (const [name, w] of [['ffn_gate_exps', 'w1'], ['ffn_up_exps', 'w3'],
                               ['ffn_down_exps', 'w2']]) {
        const experts = [];
        for (let e = 0; e < c.n_experts; ++e) experts.push(`${m}experts.${e}.${w}.weight`);
        add(`${b}${name}.weight`, experts);
      }
    } else {
      add(b + 'ffn_gate.weight', [p + 'mlp.w1.weight']);
      add(b + 'ffn_up.weight', [p + 'mlp.w3.weight']);
      add(b + 'ffn_down.weight', [p + 'mlp.w2.weight']);
    }
  }
  add('output_norm.weight', ['model.norm.weight']);
  if (!c.tie_embeddings) add('output.weight', ['lm_head.weight']);
  for (const t of expected) {
    for (const s of t.sources) assert.ok(weights.has(s), `the checkpoint has no ${s}`);
    const first = weights.get(t.sources[0]).shape;
    t.shape = [...first].reverse();
    if (t.sources.length > 1) t.shape.push(t.sources.length);
  }
  return expected;
}

async function main() {
  const [file, checkpoint] = process.argv.slice(2);
  const c = JSON.parse(fs.readFileSync(path.join(checkpoint, 'config.json'), 'utf8'));
  const weights = readSafetensors(path.join(checkpoint, 'model.safetensors'));
  const { metadata, tensorInfos, tensorDataOffset } = await gguf(file, { allowLocalFile: true });

  const hd = c.head_dim;
  const expectedMetadata = {
    'general.architecture': 'llama',
    'general.file_type': 0,
    'llama.block_count': c.n_layers,
    'llama.embedding_length': c.d_model,
    'llama.feed_forward_length': c.d_ff,
    'llama.attention.head_count': c.n_heads,
    'llama.attention.head_count_kv': c.n_kv_heads,
    'llama.attention.key_length': hd,
    'llama.attention.value_length': hd,
    'llama.rope.dimension_count': hd,
    'llama.context_length': c.max_seq_len,
    'llama.vocab_size': c.vocab_size,
  };
  if (c.n_experts > 0) {
    expectedMetadata['llama.expert_count'] = c.n_experts;
    expectedMetadata['llama.expert_used_count'] = c.top_k;
  }
  for (const [key, value] of Object.entries(expectedMetadata))
    assert.equal(metadata[key], value, key);
  // float32 in the file: equal to the config's doubles within float32 rounding.
  for (const [key, value] of [['llama.rope.freq_base', c.rope_theta],
                              ['llama.attention.layer_norm_rms_epsilon', c.norm_eps]])
    assert.ok(Math.abs(metadata[key] - value) <= 1e-7 * value, `${key}: ${metadata[key]}`);
  assert.equal(metadata['tokenizer.ggml.tokens'].length, c.vocab_size);

  const alignment = BigInt(metadata['general.alignment'] ?? 32);
  const expected = expectedTensors(c, weights);
  assert.deepEqual(tensorInfos.map((t) => t.name).sort(), expected.map((t) => t.name).sort());
  const infos = new Map(tensorInfos.map((t) => [t.name, t]));
  const fd = fs.openSync(file, 'r');
  let ropeRowsChecked = 0;
  for (const t of expected) {
    const info = infos.get(t.name);
    assert.deepEqual(info.shape.map(Number), t.shape, `${t.name}: dims`);
    assert.equal(info.dtype, GGML_F32, `${t.name}: type`);
    assert.equal(info.offset % alignment, 0n, `${t.name}: offset ${info.offset} not aligned`);
    const bytes = t.shape.reduce((a, b) => a * b, 1) * 4;
    const data = Buffer.alloc(bytes);
    assert.equal(fs.readSync(fd, data, 0, bytes, Number(tensorDataOffset + info.offset)), bytes);
    if (t.ropeHeads) {
      const source = weights.get(t.sources[0]);
      const [rows, cols] = source.shape;
      const rowBytes = cols * 4;
      const sourceRow = (r) => source.data.subarray(r * rowBytes, (r + 1) * rowBytes);
      const want = llamaCppPermute(sourceRow, rows, t.ropeHeads);
      for (let r = 0; r < rows; ++r) {
        const got = data.subarray(r * rowBytes, (r + 1) * rowBytes);
        assert.ok(got.equals(want[r]),
                  `${t.name}: row ${r} is not llama.cpp's permuted row of ${t.sources[0]}`);
        ++ropeRowsChecked;
      }
    } else {
      const want = Buffer.concat(t.sources.map((s) => weights.get(s).data));
      assert.ok(data.equals(want), `${t.name}: data differs from ${t.sources.join(', ')}`);
    }
  }
  fs.closeSync(fd);

  const bigints = (_, v) => (typeof v === 'bigint' ? Number(v) : v);
  const header = Object.fromEntries(
    Object.entries(metadata).filter(([k]) => !k.startsWith('tokenizer.ggml.')));
  console.log(JSON.stringify({
    metadata: header,
    tensors: tensorInfos.map((t) => ({ name: t.name, shape: t.shape, dtype: t.dtype,
                                       offset: t.offset })),
    ropeRowsChecked,
  }, bigints));
  console.log('gguf reader: ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
