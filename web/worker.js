// The page's worker: owns the Domino instance (WebGPU device, model, drafter) so loading and
// generation never block the UI. Messages in: {id, op, args}; out: {id, type, ...}.
import init, { Domino } from './pkg/domino_web.js';

let domino = null;
let cancel = false;

function post(id, type, payload) {
  self.postMessage({ id, type, ...payload });
}

// Tokens of one speculative round are emitted in one synchronous run of the wasm code (a round
// yields only at its readback), so tokens flushed together by one microtask are one round: the
// live acceptance figure. The final figure comes from the result's stats.
function tokenBatcher(id) {
  let batch = null;
  return (text, tokenId) => {
    if (!batch) {
      batch = { texts: [], ids: [] };
      queueMicrotask(() => {
        post(id, 'tokens', { texts: batch.texts, ids: batch.ids, t: performance.now() });
        batch = null;
      });
    }
    batch.texts.push(text);
    if (tokenId !== undefined) batch.ids.push(tokenId);
    return !cancel;
  };
}

const ops = {
  async create() {
    await init();
    domino = await Domino.create();
    return domino.adapterInfo();
  },
  async load(id, args) {
    return domino.load({
      model: args.model,
      draft: args.draft || undefined,
      dtype: args.dtype || undefined,
      onProgress: (loaded, total, file, phase) => post(id, 'progress', { loaded, total, file, phase }),
    });
  },
  async generate(id, args) {
    cancel = false;
    return domino.generate({ ...args, onToken: tokenBatcher(id) });
  },
  async bench(id, args) {
    return domino.bench({ ...args, onProgress: (done, total, what) => post(id, 'progress', { loaded: done, total, file: what, phase: 'bench' }) });
  },
};

self.onmessage = async (e) => {
  const { id, op, args } = e.data;
  if (op === 'stop') {
    cancel = true;
    return;
  }
  try {
    if (op !== 'create' && !domino) throw new Error('WebGPU is not ready');
    const result = await ops[op](id, args || {});
    post(id, 'result', { result });
  } catch (err) {
    post(id, 'error', { message: (err && err.message) || String(err) });
  }
};
