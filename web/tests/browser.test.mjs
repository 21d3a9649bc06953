// Browser test of the demo page: headless Chromium (WebGPU on SwiftShader) driven by playwright-core.
//
// It serves web/ and tiny models from 127.0.0.1, loads them through the page's UI, generates greedily
// without and with the drafter, and asserts that the output ids equal those of the native
// `domino generate --json` on the same model and prompt. It also checks the Cache API (a reload
// fetches no weights again), the Bench button's domino-bench/1 report (merged with a native one by
// `domino report`), and the message when WebGPU is unavailable. Then the page's defaults: the real
// SmolLM2-135M-Instruct Q4_1 GGUF and the shipped Domino drafter from web/models/ (their sizes shown
// before any download), loaded as the page's Load button does, with two prompts decoded plainly and
// speculatively to the same ids as the native binary. Artifacts (screenshot, reports) go to
// target/web-test/.
//
//   bash web/build.sh && bash web/fetch-models.sh
//   node web/tests/browser.test.mjs        (DOMINO_BIN = the domino binary)
//
// Environment: DOMINO_BIN (default target/debug/domino), CHROMIUM (default /usr/bin/chromium),
// DOMINO_WEB_TEST_OUT (default target/web-test).
import { spawnSync } from 'node:child_process';
import { createServer } from 'node:http';
import { cpSync, createReadStream, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, extname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import assert from 'node:assert/strict';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const web = join(root, 'web');
const bin = process.env.DOMINO_BIN || join(root, 'target/debug/domino');
const chromium = process.env.CHROMIUM || '/usr/bin/chromium';
const out = process.env.DOMINO_WEB_TEST_OUT || join(root, 'target/web-test');

function fail(msg) {
  console.error(`browser test: FAILED: ${msg}`);
  process.exit(1);
}
const REAL_GGUF = 'SmolLM2-135M-Instruct.Q4_1.gguf';
const REAL_DRAFT = 'smollm2-135m-instruct-domino';
const webModels = join(web, 'models');
for (const [what, path] of [
  ['domino binary (DOMINO_BIN)', bin], ['Chromium (CHROMIUM)', chromium], ['web/pkg (run bash web/build.sh)', join(web, 'pkg/domino_web_bg.wasm')],
  ['the default model (run bash web/fetch-models.sh)', join(webModels, REAL_GGUF)], ['the default drafter (run bash web/fetch-models.sh)', join(webModels, REAL_DRAFT, 'model.safetensors')],
  ['the default drafter\'s lookup table (run bash web/fetch-models.sh)', join(webModels, REAL_DRAFT, 'lookup-ngrams.safetensors')],
]) {
  if (!existsSync(path)) fail(`${what} not found at ${path}`);
}
let chromiumApi;
try {
  ({ chromium: chromiumApi } = await import('playwright-core'));
} catch (e) {
  fail(`playwright-core is not installed (cd web && npm install): ${e.message}`);
}

function domino(...args) {
  const r = spawnSync(bin, args, { encoding: 'utf8', env: { ...process.env, XDG_RUNTIME_DIR: process.env.XDG_RUNTIME_DIR || tmpdir() } });
  if (r.status !== 0) fail(`domino ${args.join(' ')}: exit ${r.status}\n${r.stderr}`);
  return r.stdout;
}

// --- tiny models (random target + random Domino drafter; an always-accepting pair) ---------------
const tmp = mkdtempSync(join(tmpdir(), 'domino-web-'));
const models = join(tmp, 'models');
domino('random-model', '--out', join(models, 'target'), '--drafter', join(models, 'draft'), '--drafter-kind', 'domino', '--block-size', '4');
domino('random-model', '--out', join(models, 'aa-target'), '--always-accept-drafter', join(models, 'aa-draft'), '--drafter-kind', 'domino', '--block-size', '4');

const PROMPT = 'Hello';
const MAX = 24;
function native(model, ...extra) {
  return JSON.parse(domino('generate', '--model', join(models, model), '--prompt', PROMPT, '--max-tokens', String(MAX), '--ignore-eos', '--json', ...extra));
}
// Speculative modes verify whole blocks (4 drafts at block size 4), natively and in the page, so the
// rounds' acceptance lengths can be compared; `auto` picks k from timings, which differ.
const FULL_BLOCK = ['--draft-len', '4'];
function nativeSpec(model, ...extra) {
  return native(model, ...extra, ...FULL_BLOCK);
}
const ref = {
  plain: native('target'),
  domino: nativeSpec('target', '--draft', join(models, 'draft')),
  backbone: nativeSpec('target', '--draft', join(models, 'draft'), '--no-head'),
  aa: nativeSpec('aa-target', '--draft', join(models, 'aa-draft')),
};
// A copy of the drafter with a prompt-lookup table (lookup-ngrams.safetensors) built from the tiny
// target's own continuations (`train data` -> `train ngrams`), the prompt's among them.
const LOOKUP_TABLE = 'lookup-ngrams.safetensors';
const tableDraft = join(models, 'draft-table');
cpSync(join(models, 'draft'), tableDraft, { recursive: true });
writeFileSync(join(tmp, 'prompts.jsonl'), [PROMPT, 'The', 'Once upon a time'].map((prompt) => JSON.stringify({ prompt })).join('\n') + '\n');
domino('train', 'data', '--model', join(models, 'target'), '--prompts', join(tmp, 'prompts.jsonl'), '--out', join(tmp, 'table-data'), '--max-new-tokens', String(MAX + 8), '--ignore-eos', '--device', 'cpu');
domino('train', 'ngrams', '--data', join(tmp, 'table-data'), '--out', join(tableDraft, LOOKUP_TABLE), '--min-count', '1');
ref.table = native('target', '--draft', tableDraft, '--lookup');
// The number of contexts in a table file (rows of its `contexts` tensor), read from the header.
function tableContexts(file) {
  const bytes = readFileSync(file);
  const header = JSON.parse(bytes.subarray(8, 8 + Number(bytes.readBigUInt64LE(0))).toString('utf8'));
  return header.contexts.shape[0];
}
// Greedy speculative decoding is lossless: the native modes agree with each other.
assert.deepEqual(ref.domino.output_ids, ref.plain.output_ids, 'native domino vs plain');
assert.deepEqual(ref.table.output_ids, ref.plain.output_ids, 'native domino + lookup table vs plain');
assert.ok(ref.table.stats.table_rounds > 0, `native table rounds: ${ref.table.stats.table_rounds}`);
assert.deepEqual(ref.backbone.output_ids, ref.plain.output_ids, 'native backbone vs plain');

// The real model, natively: two prompts (one in the chat template), plain and speculative with the
// shipped drafter at a fixed draft length, so the page must verify the same blocks.
const realGguf = join(webModels, REAL_GGUF);
const realDraft = join(webModels, REAL_DRAFT);
// SwiftShader decodes SmolLM2 at about 0.5-1 tok/s and verifies a speculative round in several
// seconds (its drafter accepts little), so the speculative runs are shorter.
const REAL_MAX = 24;
const REAL_MAX_SPEC = 12;
const REAL_DRAFT_LEN = 3;
const REAL_PROMPTS = [
  { name: 'chat', prompt: 'What is the capital of France?', chat: true },
  { name: 'code', prompt: 'def fibonacci(n):', chat: false },
];
const realRef = {};
for (const p of REAL_PROMPTS) {
  const args = ['generate', '--model', realGguf, '--prompt', p.prompt, '--max-tokens', String(REAL_MAX), '--ignore-eos', '--json', ...(p.chat ? ['--chat'] : [])];
  const spec = args.map((a, i) => (args[i - 1] === '--max-tokens' ? String(REAL_MAX_SPEC) : a));
  realRef[p.name] = {
    plain: JSON.parse(domino(...args)),
    domino: JSON.parse(domino(...spec, '--draft', realDraft, '--draft-len', String(REAL_DRAFT_LEN))),
  };
  assert.deepEqual(realRef[p.name].domino.output_ids, realRef[p.name].plain.output_ids.slice(0, REAL_MAX_SPEC), `native ${p.name}: domino vs plain`);
}

// Weight bytes a decode step reads natively, kept quantized (auto) and dequantized (f16).
const realPlan = {};
for (const d of ['auto', 'f16']) realPlan[d] = JSON.parse(domino('plan', '--model', realGguf, '--dtype', d, '--json')).total_weight_bytes;

// --- static server on 127.0.0.1 ------------------------------------------------------------------
// /tiny/ serves the tiny random models, /models/ the page's own web/models/ (the defaults), the rest
// web/. HEAD answers with the size only; GETs are counted per path.
const TYPES = { '.html': 'text/html', '.js': 'text/javascript', '.mjs': 'text/javascript', '.css': 'text/css', '.wasm': 'application/wasm', '.json': 'application/json' };
const hits = new Map();
const heads = new Map();
const server = createServer((req, res) => {
  const path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
  (req.method === 'HEAD' ? heads : hits).set(path, ((req.method === 'HEAD' ? heads : hits).get(path) || 0) + 1);
  const file = path.startsWith('/tiny/') ? join(models, path.slice('/tiny/'.length)) : join(web, path === '/' ? 'index.html' : path);
  if (!file.startsWith(models) && !file.startsWith(web)) { res.writeHead(403).end(); return; }
  if (!existsSync(file) || !statSync(file).isFile()) { res.writeHead(404).end('not found'); return; }
  const size = statSync(file).size;
  res.writeHead(200, { 'content-type': TYPES[extname(file)] || 'application/octet-stream', 'content-length': size });
  if (req.method === 'HEAD') { res.end(); return; }
  createReadStream(file).pipe(res);
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const base = `http://127.0.0.1:${server.address().port}`;

const FLAGS = ['--headless=new', '--no-sandbox', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'];
mkdirSync(out, { recursive: true });
const results = {};
let browser;
try {
  browser = await chromiumApi.launch({ executablePath: chromium, args: [...FLAGS, '--enable-unsafe-webgpu'], headless: true });
  const page = await browser.newPage({ viewport: { width: 1100, height: 1000 } });
  const logs = [];
  page.on('console', (m) => logs.push(`[console.${m.type()}] ${m.text()}`));
  page.on('pageerror', (e) => logs.push(`[pageerror] ${e.message}`));
  const step = async (what, fn) => {
    const t0 = Date.now();
    try {
      const r = await fn();
      console.log(`ok   ${what} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
      return r;
    } catch (e) {
      await page.screenshot({ path: join(out, 'failure.png'), fullPage: true }).catch(() => {});
      const err = await page.locator('#error, #fatal').allTextContents().catch(() => []);
      throw new Error(`${what}: ${e.message}\npage errors: ${err.filter(Boolean).join(' | ')}\n${logs.slice(-20).join('\n')}`);
    }
  };

  const open = async (model, draft) => {
    const query = model ? `?model=${encodeURIComponent(`/tiny/${model}`)}&draft=${encodeURIComponent(`/tiny/${draft}`)}` : '';
    await page.goto(`${base}/index.html${query}`);
    await page.waitForSelector('#adapter[data-state=ready], #fatal:not([hidden])', { timeout: 60000 });
    const fatal = await page.locator('#fatal').isVisible();
    if (fatal) throw new Error(`WebGPU did not start: ${await page.locator('#fatal').textContent()}`);
  };
  const load = async (timeout = 120000) => {
    await page.click('#load');
    await page.waitForSelector('#load-status[data-state]', { timeout });
    const st = await page.locator('#load-status').getAttribute('data-state');
    if (st !== 'loaded') throw new Error(`load failed: ${await page.locator('#error').textContent()}`);
  };
  const generate = async (mode, { prompt = PROMPT, max = MAX, chat = false, draftLen = 4, lookup = false, timeout = 120000 } = {}) => {
    await page.check(`input[name=mode][value=${mode}]`);
    await page.fill('#prompt', prompt);
    await page.fill('#max-tokens', String(max));
    if (await page.isEnabled('#chat')) await page.setChecked('#chat', chat);
    else assert.equal(chat, false, 'chat asked for but the model has no chat template');
    await page.check('#ignore-eos');
    await page.fill('#draft-len', String(draftLen));
    await page.setChecked('#lookup', lookup);
    await page.click('#generate');
    await page.waitForFunction(() => ['done', 'failed'].includes(document.getElementById('summary').dataset.state), null, { timeout });
    if ((await page.locator('#summary').getAttribute('data-state')) !== 'done') throw new Error(await page.locator('#error').textContent());
    return JSON.parse(await page.locator('#result-json').textContent());
  };

  await step('page starts WebGPU (SwiftShader) and shows the adapter', async () => {
    await open('target', 'draft');
    const info = await page.locator('#adapter').textContent();
    assert.match(info, /Features:/);
    results.adapter = info.trim();
  });
  await step('load target + Domino drafter over HTTP through the page', load);
  for (const mode of ['plain', 'domino', 'backbone']) {
    await step(`generate (${mode}) = native domino generate --json`, async () => {
      const r = await generate(mode);
      assert.deepEqual(r.prompt_ids, ref[mode].prompt_ids, 'prompt ids');
      assert.deepEqual(r.output_ids, ref[mode].output_ids, 'output ids');
      assert.equal(r.text, ref[mode].text, 'text');
      assert.deepEqual(Object.keys(r), Object.keys(ref[mode]), 'result keys');
      assert.deepEqual(Object.keys(r.stats), Object.keys(ref[mode].stats), 'stats keys');
      if (mode !== 'plain') assert.deepEqual(r.stats.acceptance_lengths, ref[mode].stats.acceptance_lengths, 'acceptance lengths');
      results[mode] = r;
    });
  }
  await step('generate (domino + prompt lookup, draft length auto) = plain output', async () => {
    const r = await generate('domino', { draftLen: 'auto', lookup: true });
    assert.deepEqual(r.output_ids, ref.plain.output_ids, 'output ids');
    const { lookup_rounds, rounds, acceptance_lengths, draft_lengths } = r.stats;
    assert.ok(Number.isInteger(lookup_rounds) && lookup_rounds <= rounds, `lookup_rounds ${lookup_rounds} of ${rounds}`);
    assert.ok(acceptance_lengths.every((a, i) => a <= draft_lengths[i] + 1), 'acceptance within each round');
    results.lookup = r;
  });
  await step('generate (domino + prompt lookup, draft length 3) = plain output, rounds of at most 3', async () => {
    const r = await generate('domino', { draftLen: 3, lookup: true });
    assert.deepEqual(r.output_ids, ref.plain.output_ids, 'output ids');
    const { lookup_rounds, rounds, draft_lengths } = r.stats;
    assert.ok(Number.isInteger(lookup_rounds) && lookup_rounds <= rounds, `lookup_rounds ${lookup_rounds} of ${rounds}`);
    assert.ok(draft_lengths.every((k) => k <= 3), `draft lengths ${draft_lengths}`);
  });
  await step('drafter folder with a lookup table: loaded beside the weights, its proposals keep the output', async () => {
    await open('target', 'draft-table');
    await load();
    const info = await page.evaluate(() => window.dominoLoaded);
    assert.equal(info.lookup_table_contexts, tableContexts(join(tableDraft, LOOKUP_TABLE)), 'contexts in the table');
    assert.ok((hits.get(`/tiny/draft/${LOOKUP_TABLE}`) || 0) >= 1, 'the drafter folder without a table was asked for one');
    assert.equal(hits.get(`/tiny/target/${LOOKUP_TABLE}`), undefined, 'a model folder is not asked for a lookup table');
    const r = await generate('domino', { draftLen: 'auto', lookup: true });
    assert.deepEqual(r.output_ids, ref.plain.output_ids, 'output ids');
    const { table_rounds, lookup_rounds } = r.stats;
    assert.ok(table_rounds > 0 && table_rounds <= lookup_rounds, `table_rounds ${table_rounds} of ${lookup_rounds} lookup rounds`);
    results.lookup_table = r;
  });
  await page.screenshot({ path: join(out, 'page.png'), fullPage: true });

  await step('reload: files come from the Cache API, no second download', async () => {
    const before = hits.get('/tiny/target/model.safetensors') || 0;
    assert.ok(before >= 1, 'the first load fetched the weights');
    await open('target', 'draft');
    await load();
    assert.equal(hits.get('/tiny/target/model.safetensors'), before, 'weights fetched again after a reload');
    const r = await generate('domino');
    assert.deepEqual(r.output_ids, ref.domino.output_ids);
  });

  await step('always-accepting pair: whole blocks accepted, as natively', async () => {
    await open('aa-target', 'aa-draft');
    await load();
    const r = await generate('domino');
    assert.deepEqual(r.output_ids, ref.aa.output_ids, 'output ids');
    assert.deepEqual(r.stats.acceptance_lengths, ref.aa.stats.acceptance_lengths, 'acceptance lengths');
    assert.ok(r.stats.mean_acceptance > 4, `mean acceptance ${r.stats.mean_acceptance}`);
    results.aa = r;
  });
  await page.screenshot({ path: join(out, 'page-always-accept.png'), fullPage: true });

  await step('Bench button: domino-bench/1 report (runner browser) merges with a native one', async () => {
    await page.fill('#max-tokens', '8');
    await page.click('#bench');
    await page.waitForSelector('#bench-out[data-state=done], #error:not([hidden])', { timeout: 300000 });
    const report = JSON.parse(await page.locator('#bench-json').textContent());
    assert.equal(report.schema, 'domino-bench/1');
    assert.equal(report.runner, 'browser');
    assert.deepEqual(report.adapters[0].modes.map((m) => m.mode), ['plain', 'backbone (--no-head)', 'domino']);
    for (const m of report.adapters[0].modes) {
      assert.ok(Number.isFinite(m.decode_tokens_per_s) && m.decode_tokens_per_s > 0, `${m.mode} decode tok/s`);
    }
    writeFileSync(join(out, 'bench-browser.json'), JSON.stringify(report, null, 2));
    domino('bench', '--model', join(models, 'aa-target'), '--draft', join(models, 'aa-draft'), '--max-tokens', '8', '--runs', '1', '--json', join(out, 'bench-native.json'));
    const md = domino('report', join(out, 'bench-native.json'), join(out, 'bench-browser.json'), '--html', join(out, 'report.html'));
    assert.match(md, /browser/);
    writeFileSync(join(out, 'report.md'), md);
  });
  await page.screenshot({ path: join(out, 'page-bench.png'), fullPage: true });

  // --- the page's defaults: the real model (GGUF) and the shipped drafter ----------------------
  const gguf = `/models/${REAL_GGUF}`;
  await step('default page: model and drafter sizes shown before downloading (HEAD)', async () => {
    await open();
    assert.equal(await page.inputValue('#model-url'), `models/${REAL_GGUF}`);
    assert.equal(await page.inputValue('#draft-url'), `models/${REAL_DRAFT}`);
    await page.waitForSelector('#model-size[data-state=remote]', { timeout: 30000 });
    await page.waitForSelector('#draft-size[data-state=remote]', { timeout: 30000 });
    assert.equal(Number(await page.getAttribute('#model-size', 'data-bytes')), statSync(realGguf).size, 'model size');
    const draftBytes = ['config.json', 'model.safetensors', LOOKUP_TABLE].reduce((n, f) => n + statSync(join(realDraft, f)).size, 0);
    assert.equal(Number(await page.getAttribute('#draft-size', 'data-bytes')), draftBytes, 'drafter size');
    assert.match(await page.locator('#model-size').textContent(), /98\.4 MB to download/);
    assert.ok(heads.get(gguf) >= 1, 'a HEAD request for the GGUF file');
    assert.equal(hits.get(gguf) || 0, 0, 'the GGUF file was downloaded before Load');
    results.real_sizes = { model: await page.locator('#model-size').textContent(), drafter: await page.locator('#draft-size').textContent() };
  });
  await step('load SmolLM2-135M-Instruct Q4_1 GGUF + the shipped Domino drafter (page defaults)', async () => {
    await load(600000);
    const info = await page.evaluate(() => window.dominoLoaded);
    assert.equal(info.format, 'gguf');
    assert.equal(info.dtype, 'auto');
    assert.equal(info.drafter_kind, 'domino');
    assert.equal(info.block_size, 8);
    assert.equal(info.lookup_table_contexts, tableContexts(join(realDraft, LOOKUP_TABLE)), 'the shipped lookup table');
    assert.equal(info.has_tokenizer, true);
    assert.equal(info.has_chat_template, true);
    assert.equal(info.vocab_size, 49152);
    // Kept quantized: the bytes a decode step reads are those of native `--dtype auto` (Q4_1 blocks,
    // the Q8_0 embedding as the tied lm_head), under 40% of the same weights dequantized to f16.
    assert.equal(info.weight_bytes_per_token, realPlan.auto, 'weight bytes per token = native domino plan --dtype auto');
    assert.ok(info.weight_bytes_per_token < 0.4 * realPlan.f16, `weight bytes per token ${info.weight_bytes_per_token} vs f16 ${realPlan.f16}`);
    // Streamed: the largest read from the Blob is one tensor (token_embd, Q8_0: 49152 x 576 / 32
    // blocks of 34 bytes), never the file.
    assert.ok(info.max_read_bytes > 0 && info.max_read_bytes <= 49152 * 576 / 32 * 34, `largest read ${info.max_read_bytes}`);
    assert.equal(hits.get(gguf), 1, 'the GGUF file was downloaded once');
    await page.waitForSelector('#model-size[data-state=cached]', { timeout: 30000 });
    results.real_load = info;
  });
  for (const p of REAL_PROMPTS) {
    for (const mode of ['plain', 'domino']) {
      await step(`SmolLM2 ${p.name} prompt (${mode}) = native domino generate --json`, async () => {
        const want = realRef[p.name][mode];
        const r = await generate(mode, { prompt: p.prompt, max: mode === 'plain' ? REAL_MAX : REAL_MAX_SPEC, chat: p.chat, draftLen: REAL_DRAFT_LEN, timeout: 300000 });
        assert.deepEqual(r.prompt_ids, want.prompt_ids, 'prompt ids');
        assert.deepEqual(r.output_ids, want.output_ids, 'output ids');
        assert.equal(r.text, want.text, 'text');
        if (mode === 'domino') {
          assert.deepEqual(r.stats.acceptance_lengths, want.stats.acceptance_lengths, 'acceptance lengths');
          assert.deepEqual(r.stats.draft_lengths, want.stats.draft_lengths, 'draft lengths');
        }
        results[`real_${p.name}_${mode}`] = { text: r.text, output_ids: r.output_ids, stats: r.stats };
      });
    }
  }
  await page.screenshot({ path: join(out, 'page-smollm2.png'), fullPage: true });
  await step('the same GGUF as a local File (file picker), no drafter: the native greedy prefix', async () => {
    await open();
    await page.fill('#draft-url', '');
    await page.setInputFiles('#model-file', realGguf);
    await page.waitForSelector('#model-size[data-state=local]', { timeout: 30000 });
    const before = hits.get(gguf);
    await load(600000);
    const info = await page.evaluate(() => window.dominoLoaded);
    assert.equal(info.model, REAL_GGUF);
    assert.equal(info.format, 'gguf');
    assert.equal(info.drafter, null);
    assert.equal(hits.get(gguf), before, 'a local File is not fetched');
    const code = REAL_PROMPTS.find((p) => p.name === 'code');
    const r = await generate('plain', { prompt: code.prompt, max: 6, chat: false, timeout: 300000 });
    assert.deepEqual(r.output_ids, realRef.code.plain.output_ids.slice(0, 6), 'output ids');
  });
  await browser.close();

  await step('without WebGPU the page says so', async () => {
    browser = await chromiumApi.launch({ executablePath: chromium, args: [...FLAGS, '--disable-webgpu', '--disable-unsafe-webgpu'], headless: true });
    const p = await browser.newPage();
    await p.goto(`${base}/index.html`);
    await p.waitForSelector('#fatal:not([hidden])', { timeout: 60000 });
    const msg = await p.locator('#fatal').textContent();
    assert.match(msg, /WebGPU/);
    results.no_webgpu_message = msg;
  });
  writeFileSync(join(out, 'results.json'), JSON.stringify(results, null, 2));
  console.log(`browser test: passed; artifacts in ${out}`);
} catch (e) {
  console.error(e.message);
  process.exitCode = 1;
} finally {
  await browser?.close().catch(() => {});
  server.close();
  rmSync(tmp, { recursive: true, force: true });
}
