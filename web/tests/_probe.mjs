import { createServer } from 'node:http';
import { createReadStream, existsSync, statSync } from 'node:fs';
import { extname, join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
const web = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const TYPES = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css', '.wasm': 'application/wasm', '.json': 'application/json' };
const server = createServer((req, res) => {
  const path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
  const file = join(web, path === '/' ? 'index.html' : path);
  if (!existsSync(file) || !statSync(file).isFile()) { res.writeHead(404).end(); return; }
  res.writeHead(200, { 'content-type': TYPES[extname(file)] || 'application/octet-stream', 'content-length': statSync(file).size });
  if (req.method === 'HEAD') return res.end();
  createReadStream(file).pipe(res);
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const base = `http://127.0.0.1:${server.address().port}`;
const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--headless=new', '--no-sandbox', '--enable-unsafe-webgpu'], headless: true });
const page = await browser.newPage();
page.on('console', (m) => console.log('[console]', m.text()));
const t0 = Date.now();
const T = () => ((Date.now() - t0) / 1000).toFixed(1);
try {
  await page.goto(`${base}/index.html`);
  await page.waitForSelector('#adapter[data-state=ready], #fatal:not([hidden])', { timeout: 60000 });
  await page.waitForSelector('#model-size[data-state=remote]', { timeout: 30000 });
  console.log(T(), 'sizes', await page.locator('#model-size').textContent(), '|', await page.locator('#draft-size').textContent());
  await page.click('#load');
  await page.waitForSelector('#load-status[data-state]', { timeout: 600000 });
  console.log(T(), await page.locator('#load-status').textContent(), await page.locator('#error').textContent());
  console.log(JSON.stringify(await page.evaluate(() => window.dominoLoaded)));
  for (const [mode, chat, prompt] of (process.env.PROBE_RUNS ? JSON.parse(process.env.PROBE_RUNS) : [['plain', true, 'What is the capital of France?']])) {
    await page.check(`input[name=mode][value=${mode}]`);
    await page.fill('#prompt', prompt);
    await page.fill('#max-tokens', process.env.PROBE_MAX || '16');
    await page.setChecked('#chat', chat);
    await page.check('#ignore-eos');
    await page.fill('#draft-len', '4');
    await page.click('#generate');
    await page.waitForFunction(() => ['done', 'failed'].includes(document.getElementById('summary').dataset.state), null, { timeout: 600000 });
    console.log(T(), mode, await page.locator('#summary').textContent(), await page.locator('#error').textContent());
    console.log(await page.locator('#result-json').textContent());
  }
  if (process.env.PROBE_BENCH) {
    await page.fill('#max-tokens', process.env.PROBE_BENCH);
    await page.click('#bench');
    await page.waitForSelector('#bench-out[data-state=done], #error:not([hidden])', { timeout: 1200000 });
    console.log(T(), 'BENCH', await page.locator('#bench-json').textContent(), await page.locator('#error').textContent());
  }
} finally {
  await browser.close();
  server.close();
}
