//! A static n-gram table for prompt lookup (`--lookup`): for every 2-, 3- and 4-token context seen
//! in a corpus of the target's own text, the token that most often followed it, with how often.
//!
//! Prompt lookup copies what followed an earlier occurrence of the text's last tokens in the text
//! itself; where the text has no such occurrence, this table proposes what followed the same
//! tokens in other generations of the same model (common idioms: `for i in range(len(`, the line
//! after a `def`), like llama.cpp's static lookup cache. It ships beside a drafter as
//! `lookup-ngrams.safetensors` and is built by `domino train ngrams` from `domino train data`.
//!
//! File layout (safetensors): `contexts` [m, 4] U32 (the context's tokens, then u32::MAX padding;
//! 2 to 4 tokens), `next` [m] U32, `count` [m] U32 (times `next` followed the context), `total`
//! [m] U32 (times the context occurred with a successor); metadata `format` = FORMAT and
//! `vocab_size`. Every field is checked on load: a hostile file is an error, never a panic.

use crate::error::{ModelError, Result};
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use std::collections::HashMap;
use std::path::Path;

pub const FORMAT: &str = "domino-lookup-ngrams/1";
/// The file name a drafter folder holds its table under.
pub const FILE_NAME: &str = "lookup-ngrams.safetensors";
/// Context lengths looked up, longest first.
pub const MIN_CONTEXT: usize = 2;
pub const MAX_CONTEXT: usize = 4;
/// Confidence classes of a proposal (`StaticProposal::confidence`), by `count / (total + 1)`: the
/// + 1 makes a context seen twice less sure than one seen fifty times.
pub const CONFIDENCE_CLASSES: usize = 3;
const CONFIDENCE_BOUNDS: [f64; CONFIDENCE_CLASSES - 1] = [0.5, 0.8];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Successor {
    pub next: u32,
    pub count: u32,
    pub total: u32,
}

impl Successor {
    /// 0 (least sure) to CONFIDENCE_CLASSES - 1.
    pub fn confidence(&self) -> usize {
        let p = self.count as f64 / (self.total as f64 + 1.0);
        CONFIDENCE_BOUNDS.iter().filter(|&&b| p >= b).count()
    }
}

/// A proposal from the table: the context length of its first token's match, that match's
/// confidence class, and the tokens (each next one looked up after the ones before it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticProposal {
    pub context: usize,
    pub confidence: usize,
    pub tokens: Vec<u32>,
}

type Key = [u32; MAX_CONTEXT];

fn key(context: &[u32]) -> Key {
    let mut k = [u32::MAX; MAX_CONTEXT];
    k[..context.len()].copy_from_slice(context);
    k
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct NgramTable {
    vocab_size: usize,
    entries: HashMap<Key, Successor>,
}

impl NgramTable {
    /// Count every context of 2-4 tokens in `texts` and keep, for each, its most frequent successor
    /// (the smallest id among ties, so the table does not depend on hashing order) where it
    /// followed at least `min_count` times.
    pub fn build<'a>(texts: impl IntoIterator<Item = &'a [u32]>, vocab_size: usize, min_count: u32) -> Self {
        let mut counts: HashMap<Key, HashMap<u32, u32>> = HashMap::new();
        for text in texts {
            for i in MIN_CONTEXT..text.len() {
                for n in MIN_CONTEXT..=MAX_CONTEXT.min(i) {
                    *counts.entry(key(&text[i - n..i])).or_default().entry(text[i]).or_default() += 1;
                }
            }
        }
        let entries = counts
            .into_iter()
            .filter_map(|(k, followers)| {
                let total = followers.values().sum::<u32>();
                let (&next, &count) = followers.iter().max_by_key(|(&t, &c)| (c, std::cmp::Reverse(t)))?;
                (count >= min_count.max(1)).then_some((k, Successor { next, count, total }))
            })
            .collect();
        Self { vocab_size, entries }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The successor of exactly this context (2-4 tokens), if the table has it.
    pub fn successor(&self, context: &[u32]) -> Option<Successor> {
        if !(MIN_CONTEXT..=MAX_CONTEXT).contains(&context.len()) {
            return None;
        }
        self.entries.get(&key(context)).copied()
    }

    /// The successor of the longest suffix of `text` (4 tokens, else 3, else 2) in the table.
    fn longest(&self, text: &[u32]) -> Option<(usize, Successor)> {
        (MIN_CONTEXT..=MAX_CONTEXT.min(text.len())).rev().find_map(|n| self.successor(&text[text.len() - n..]).map(|s| (n, s)))
    }

    /// Up to `max_len` tokens after `text`: the successor of its longest suffix in the table, then
    /// the successor of the text with that token appended, and so on while the table has one.
    pub fn propose(&self, text: &[u32], max_len: usize) -> Option<StaticProposal> {
        if max_len == 0 {
            return None;
        }
        let (context, first) = self.longest(text)?;
        // The chain only ever looks at its last MAX_CONTEXT tokens.
        let mut tail: Vec<u32> = text[text.len().saturating_sub(MAX_CONTEXT)..].to_vec();
        let mut tokens = vec![first.next];
        tail.push(first.next);
        while tokens.len() < max_len {
            let Some((_, s)) = self.longest(&tail[tail.len() - MAX_CONTEXT.min(tail.len())..]) else { break };
            tokens.push(s.next);
            tail.push(s.next);
        }
        Some(StaticProposal { context, confidence: first.confidence(), tokens })
    }

    /// The safetensors bytes of the table (entries sorted, so equal tables give equal files).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut rows: Vec<(&Key, &Successor)> = self.entries.iter().collect();
        rows.sort_unstable_by_key(|(k, _)| **k);
        let contexts: Vec<u32> = rows.iter().flat_map(|(k, _)| k.iter().copied()).collect();
        let next: Vec<u32> = rows.iter().map(|(_, s)| s.next).collect();
        let count: Vec<u32> = rows.iter().map(|(_, s)| s.count).collect();
        let total: Vec<u32> = rows.iter().map(|(_, s)| s.total).collect();
        let m = rows.len();
        let bytes = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (c, n, k, t) = (bytes(&contexts), bytes(&next), bytes(&count), bytes(&total));
        fn view(data: &[u8], shape: Vec<usize>) -> TensorView<'_> {
            TensorView::new(Dtype::U32, shape, data).expect("shape matches data")
        }
        let tensors = [("contexts", view(&c, vec![m, MAX_CONTEXT])), ("next", view(&n, vec![m])), ("count", view(&k, vec![m])), ("total", view(&t, vec![m]))];
        let meta = HashMap::from([("format".to_string(), FORMAT.to_string()), ("vocab_size".to_string(), self.vocab_size.to_string())]);
        safetensors::serialize(tensors, Some(meta)).expect("serializing in-memory tensors")
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.to_bytes()).map_err(|e| ModelError::Io { path: path.into(), source: e })
    }

    /// Parse a table file; `path` names it in errors.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        let bad = |message: String| ModelError::Config { path: path.into(), message: format!("lookup n-gram table: {message}") };
        let st = SafeTensors::deserialize(bytes).map_err(|e| ModelError::Safetensors { path: path.into(), message: e.to_string() })?;
        let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| ModelError::Safetensors { path: path.into(), message: e.to_string() })?;
        let meta = meta.metadata().clone().unwrap_or_default();
        match meta.get("format") {
            Some(f) if f == FORMAT => {}
            other => return Err(bad(format!("format {other:?}, expected {FORMAT:?}"))),
        }
        let vocab_size: usize = meta.get("vocab_size").and_then(|v| v.parse().ok()).filter(|&v| v > 0 && v < u32::MAX as usize).ok_or_else(|| bad("missing or invalid vocab_size".into()))?;
        let u32s = |name: &str, shape: &[usize]| -> Result<Vec<u32>> {
            let t = st.tensor(name).map_err(|_| ModelError::MissingTensor { name: name.into(), where_: path.display().to_string() })?;
            if t.dtype() != Dtype::U32 {
                return Err(bad(format!("tensor {name} is {:?}, expected U32", t.dtype())));
            }
            if t.shape() != shape {
                return Err(ModelError::Shape { name: name.into(), expected: shape.to_vec(), found: t.shape().to_vec(), path: path.into() });
            }
            Ok(t.data().chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
        };
        let m = st.tensor("next").map(|t| t.shape().first().copied().unwrap_or(0)).map_err(|_| ModelError::MissingTensor { name: "next".into(), where_: path.display().to_string() })?;
        let contexts = u32s("contexts", &[m, MAX_CONTEXT])?;
        let (next, count, total) = (u32s("next", &[m])?, u32s("count", &[m])?, u32s("total", &[m])?);
        let mut entries = HashMap::with_capacity(m);
        for i in 0..m {
            let k: Key = contexts[i * MAX_CONTEXT..(i + 1) * MAX_CONTEXT].try_into().expect("MAX_CONTEXT words");
            let n = k.iter().take_while(|&&t| t != u32::MAX).count();
            if n < MIN_CONTEXT || k[n..].iter().any(|&t| t != u32::MAX) {
                return Err(bad(format!("entry {i}: a context must be {MIN_CONTEXT}-{MAX_CONTEXT} tokens, then u32::MAX padding")));
            }
            if let Some(&t) = k[..n].iter().chain([&next[i]]).find(|&&t| t as usize >= vocab_size) {
                return Err(bad(format!("entry {i}: token {t} outside the vocabulary ({vocab_size})")));
            }
            if count[i] == 0 || count[i] > total[i] {
                return Err(bad(format!("entry {i}: count {} of total {}", count[i], total[i])));
            }
            if entries.insert(k, Successor { next: next[i], count: count[i], total: total[i] }).is_some() {
                return Err(bad(format!("entry {i}: a context listed twice")));
            }
        }
        Ok(Self { vocab_size, entries })
    }

    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ModelError::Missing { path: path.into() },
            _ => ModelError::Io { path: path.into(), source: e },
        })?;
        Self::from_bytes(&bytes, path)
    }

    /// The table of a drafter folder (`FILE_NAME`), None where it has none; checked against the
    /// target's vocabulary (`for_target`).
    pub fn load_beside(dir: &Path, target_vocab: usize) -> Result<Option<Self>> {
        let path = dir.join(FILE_NAME);
        if !path.exists() {
            return Ok(None);
        }
        Self::load(&path)?.for_target(&path, target_vocab).map(Some)
    }

    /// This table where it was built for the target's vocabulary (a table of another tokenizer
    /// would only propose nonsense), else an error naming `path`.
    pub fn for_target(self, path: &Path, target_vocab: usize) -> Result<Self> {
        if self.vocab_size != target_vocab {
            return Err(ModelError::Config { path: path.into(), message: format!("lookup n-gram table for a vocabulary of {}, the target has {target_vocab}", self.vocab_size) });
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_frequent_successor_of_the_longest_context_is_proposed_and_chained() {
        // "1 2 3" is followed by 4 twice and by 9 once (2 / (3 + 1): confidence class 1); "2 3"
        // likewise; "3 4" by 5.
        let texts: Vec<Vec<u32>> = vec![vec![1, 2, 3, 4, 5, 6], vec![7, 1, 2, 3, 4, 5], vec![8, 1, 2, 3, 9]];
        let t = NgramTable::build(texts.iter().map(|v| v.as_slice()), 10, 1);
        assert_eq!(t.successor(&[1, 2, 3]), Some(Successor { next: 4, count: 2, total: 3 }));
        assert_eq!(t.successor(&[2, 3]), Some(Successor { next: 4, count: 2, total: 3 }));
        let p = t.propose(&[0, 0, 1, 2, 3], 3).unwrap();
        assert_eq!(p, StaticProposal { context: 3, confidence: 1, tokens: vec![4, 5, 6] });
        // A 2-token context where the 3- and 4-token ones are unknown; the chain stops where the
        // table has no successor.
        assert_eq!(t.propose(&[9, 2, 3], 8).unwrap(), StaticProposal { context: 2, confidence: 1, tokens: vec![4, 5, 6] });
        assert_eq!(t.propose(&[5, 6], 8), None);
        assert_eq!(t.propose(&[3], 8), None);
        assert_eq!(t.propose(&[1, 2, 3], 0), None);
        // min_count drops contexts whose best successor is rare.
        let t2 = NgramTable::build(texts.iter().map(|v| v.as_slice()), 10, 2);
        assert_eq!(t2.successor(&[3, 4]), Some(Successor { next: 5, count: 2, total: 2 }));
        assert_eq!(t2.successor(&[4, 5]), None);
    }

    #[test]
    fn confidence_grows_with_share_and_evidence() {
        let s = |count, total| Successor { next: 0, count, total };
        assert_eq!(s(2, 2).confidence(), 1); // 2/3
        assert_eq!(s(50, 50).confidence(), 2);
        assert_eq!(s(3, 10).confidence(), 0);
    }

    #[test]
    fn the_table_matches_a_brute_force_count() {
        let mut rng = 99u64;
        let text: Vec<u32> = (0..3000)
            .map(|_| {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((rng >> 33) % 4) as u32
            })
            .collect();
        let t = NgramTable::build([text.as_slice()], 4, 1);
        for n in MIN_CONTEXT..=MAX_CONTEXT {
            for c in 0..4u32.pow(n as u32) {
                let ctx: Vec<u32> = (0..n).map(|i| (c / 4u32.pow(i as u32)) % 4).collect();
                let mut follow = [0u32; 4];
                for i in n..text.len() {
                    if text[i - n..i] == ctx[..] {
                        follow[text[i] as usize] += 1;
                    }
                }
                let total: u32 = follow.iter().sum();
                let best = (0..4).max_by_key(|&t| (follow[t], std::cmp::Reverse(t))).unwrap();
                let want = (total > 0).then(|| Successor { next: best as u32, count: follow[best], total });
                assert_eq!(t.successor(&ctx), want, "{ctx:?}");
            }
        }
    }

    #[test]
    fn files_round_trip_and_hostile_ones_are_errors() {
        let texts = [vec![1u32, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4]];
        let t = NgramTable::build(texts.iter().map(|v| v.as_slice()), 6, 1);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        t.save(&path).unwrap();
        assert_eq!(NgramTable::load(&path).unwrap(), t);
        assert_eq!(NgramTable::load_beside(dir.path(), 6).unwrap(), Some(t.clone()));
        assert_eq!(NgramTable::load_beside(&dir.path().join("none"), 6).unwrap(), None);
        let err = NgramTable::load_beside(dir.path(), 7).unwrap_err().to_string();
        assert!(err.contains("vocabulary of 6"), "{err}");
        // Truncated, and every field broken in turn.
        let bytes = t.to_bytes();
        assert!(NgramTable::from_bytes(&bytes[..bytes.len() - 3], &path).is_err());
        let with = |f: &dyn Fn(&mut NgramTable)| {
            let mut t = t.clone();
            f(&mut t);
            NgramTable::from_bytes(&t.to_bytes(), &path).map(|_| ()).unwrap_err().to_string()
        };
        let first = *t.entries.keys().next().unwrap();
        assert!(with(&|t| t.vocab_size = 2).contains("outside the vocabulary"));
        assert!(with(&|t| t.entries.get_mut(&first).unwrap().count = 0).contains("count 0"));
        assert!(with(&|t| t.entries.get_mut(&first).unwrap().total = 0).contains("of total 0"));
        assert!(with(&|t| { t.entries.insert([1, u32::MAX, u32::MAX, u32::MAX], Successor { next: 1, count: 1, total: 1 }); }).contains("2-4 tokens"));
        assert!(with(&|t| { t.entries.insert([1, 2, u32::MAX, 3], Successor { next: 1, count: 1, total: 1 }); }).contains("padding"));
        let other = safetensors::serialize([("next", TensorView::new(Dtype::U32, vec![0], &[]).unwrap())], None).unwrap();
        assert!(NgramTable::from_bytes(&other, &path).unwrap_err().to_string().contains("format"));
        assert!(matches!(NgramTable::load(&dir.path().join("missing")), Err(ModelError::Missing { .. })));
    }
}
