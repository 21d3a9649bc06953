// Browser test of the demo page: headless Chromium (WebGPU on SwiftShader) driven by playwright-core.
//
// It serves web/ and tiny models from 127.0.0.1, loads them through the page's UI, generates greedily
// without and with the drafter, and asserts that the output ids equal those of the native
// `domino generate --json` on the same model and prompt. It also checks the Cache API (a reload
// fetches no weights again), the Bench button's domino-bench/1 report (merged with a native one by
// `domino report`), and the message when WebGPU is unavailable. Artifacts (screenshot, reports) go
// to target/web-test/.
//
//   node web/tests/browser.test.mjs        (after bash web/build.sh; DOMINO_BIN = the domino binary)
//
// Environment: DOMINO_BIN (default target/debug/domino), CHROMIUM (default /usr/bin/chromium),
// DOMINO_WEB_TEST_OUT (default target/web-test).
import { spawnSync } from 'node:child_process';
import { createServer } from 'node:http';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
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
for (const [what, path] of [['domino binary (DOMINO_BIN)', bin], ['Chromium (CHROMIUM)', chromium], ['web/pkg (run bash web/build.sh)', join(web, 'pkg/domino_web_bg.wasm')]]) {
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
// Greedy speculative decoding is lossless: the native modes agree with each other.
assert.deepEqual(ref.domino.output_ids, ref.plain.output_ids, 'native domino vs plain');
assert.deepEqual(ref.backbone.output_ids, ref.plain.output_ids, 'native backbone vs plain');

// --- static server on 127.0.0.1 ------------------------------------------------------------------
const TYPES = { '.html': 'text/html', '.js': 'text/javascript', '.mjs': 'text/javascript', '.css': 'text/css', '.wasm': 'application/wasm', '.json': 'application/json' };
const hits = new Map();
const server = createServer((req, res) => {
  const path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
  hits.set(path, (hits.get(path) || 0) + 1);
  const file = path.startsWith('/models/') ? join(models, path.slice('/models/'.length)) : join(web, path === '/' ? 'index.html' : path);
  if (!file.startsWith(models) && !file.startsWith(web)) { res.writeHead(403).end(); return; }
  if (!existsSync(file) || !statSync(file).isFile()) { res.writeHead(404).end('not found'); return; }
  const body = readFileSync(file);
  res.writeHead(200, { 'content-type': TYPES[extname(file)] || 'application/octet-stream', 'content-length': body.length });
  res.end(body);
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
    await page.goto(`${base}/index.html?model=${encodeURIComponent(`/models/${model}`)}&draft=${encodeURIComponent(`/models/${draft}`)}`);
    await page.waitForSelector('#adapter[data-state=ready], #fatal:not([hidden])', { timeout: 60000 });
    const fatal = await page.locator('#fatal').isVisible();
    if (fatal) throw new Error(`WebGPU did not start: ${await page.locator('#fatal').textContent()}`);
  };
  const load = async () => {
    await page.click('#load');
    await page.waitForSelector('#load-status[data-state]', { timeout: 120000 });
    const st = await page.locator('#load-status').getAttribute('data-state');
    if (st !== 'loaded') throw new Error(`load failed: ${await page.locator('#error').textContent()}`);
  };
  const generate = async (mode) => {
    await page.check(`input[name=mode][value=${mode}]`);
    await page.fill('#prompt', PROMPT);
    await page.fill('#max-tokens', String(MAX));
    await page.check('#ignore-eos');
    await page.fill('#draft-len', '4');
    await page.click('#generate');
    await page.waitForFunction(() => ['done', 'failed'].includes(document.getElementById('summary').dataset.state), null, { timeout: 120000 });
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
  await page.screenshot({ path: join(out, 'page.png'), fullPage: true });

  await step('reload: files come from the Cache API, no second download', async () => {
    const before = hits.get('/models/target/model.safetensors') || 0;
    assert.ok(before >= 1, 'the first load fetched the weights');
    await open('target', 'draft');
    await load();
    assert.equal(hits.get('/models/target/model.safetensors'), before, 'weights fetched again after a reload');
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
