// tokenizer_bench.js -- encode throughput of the npm reference tokenizers on
// one text file, after checking tiktoken's ids against ptrain's.
//   node bench/tokenizer_bench.js NODE_MODULES VOCAB FILE PTRAIN_IDS [REPEAT]
// VOCAB: gpt2 or cl100k. Prints MB/s (median of REPEAT runs, default 3) of
// tiktoken (the WASM build of its Rust core), js-tiktoken and, for gpt2,
// gpt-3-encoder, each on one thread (they have no parallel encoder).
"use strict";
const fs = require("fs");
const path = require("path");
const [nm, vocab, file, idsFile, rep] = process.argv.slice(2);
const req = require("module").createRequire(path.resolve(nm) + "/");
const repeat = Number(rep || 3);
const text = fs.readFileSync(file, "utf8");
const mb = Buffer.byteLength(text) / 1e6;
const ranks = vocab === "gpt2" ? "gpt2" : "cl100k_base";
const { Tiktoken } = req("tiktoken/lite");
const tj = JSON.parse(fs.readFileSync(path.resolve(nm, "tiktoken/encoders/" + ranks + ".json")));
const tt = new Tiktoken(tj.bpe_ranks, tj.special_tokens, tj.pat_str);
const jst = req("js-tiktoken/lite");
const jr = req("js-tiktoken/ranks/" + ranks);
const js = new jst.Tiktoken(jr.default || jr);

const want = fs.readFileSync(idsFile, "utf8").trim();
const got = Array.from(tt.encode_ordinary(text)).join(" ");
if (got !== want) {
  console.error(`tokenizer_bench: ${file}: tiktoken's ids differ from ptrain's`);
  process.exit(1);
}
function time(name, fn, runs = repeat) {
  const t = [];
  for (let r = 0; r < runs; r++) {
    const t0 = process.hrtime.bigint();
    fn();
    t.push(Number(process.hrtime.bigint() - t0) / 1e9);
  }
  t.sort((a, b) => a - b);
  const s = t[Math.floor(runs / 2)];
  console.log(`${name.padEnd(14)} ${path.basename(file).padEnd(16)} ${mb.toFixed(2)} MB  1 thread ${(mb / s).toFixed(1).padStart(7)} MB/s`);
  return mb / s;
}
time("tiktoken", () => tt.encode_ordinary(text));
time("js-tiktoken", () => js.encode(text, [], []));
// gpt-3-encoder is far slower: one run on the first 256 KB (cut at a newline)
if (vocab === "gpt2") {
  const cut = text.lastIndexOf("\n", 262144);
  const head = text.slice(0, cut > 0 ? cut + 1 : text.length);
  const hmb = Buffer.byteLength(head) / 1e6;
  const t0 = process.hrtime.bigint();
  req("gpt-3-encoder").encode(head);
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(`${"gpt-3-encoder".padEnd(14)} ${path.basename(file).padEnd(16)} ${hmb.toFixed(2)} MB  1 thread ${(hmb / s).toFixed(3).padStart(7)} MB/s (the first ${hmb.toFixed(2)} MB, one run)`);
}
tt.free();
