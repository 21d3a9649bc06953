//! WGSL sources and the tiny preprocessor that specialises them per adapter.
//!
//! Directives (alone on a line): `#if NAME`, `#if !NAME`, `#if A || B`, `#elif NAME`, `#else`, `#endif`,
//! and `#include NAME` (a shared piece from `INCLUDES`, pasted as is: it holds no directives).
//! `{{NAME}}` is replaced by a value. Variants are chosen from what the device granted
//! (shader-f16, subgroups) when a pipeline is created, so one source serves every adapter.

use crate::error::{EngineError, Result};
use std::collections::BTreeMap;

pub const MATMUL: &str = include_str!("../../../shaders/matmul.wgsl");
pub const MATMUL_QUANT: &str = include_str!("../../../shaders/matmul_quant.wgsl");
/// Shared pieces that kernels pull in with `#include NAME`.
const INCLUDES: &[(&str, &str)] = &[("rms_scale.wgsl", include_str!("../../../shaders/rms_scale.wgsl"))];
pub const RMSNORM: &str = include_str!("../../../shaders/rmsnorm.wgsl");
pub const ROPE: &str = include_str!("../../../shaders/rope.wgsl");
pub const ATTENTION: &str = include_str!("../../../shaders/attention.wgsl");
pub const EMBEDDING: &str = include_str!("../../../shaders/embedding.wgsl");
pub const SAMPLING: &str = include_str!("../../../shaders/sampling.wgsl");
pub const COPY: &str = include_str!("../../../shaders/copy.wgsl");
pub const DOMINO_HEAD: &str = include_str!("../../../shaders/domino_head.wgsl");
pub const SPECULATIVE: &str = include_str!("../../../shaders/speculative.wgsl");
pub const MATMUL_GPU: &str = include_str!("../../../shaders/matmul_gpu.wgsl");

/// Flags and values a shader is specialised with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Defines {
    pub flags: Vec<&'static str>,
    pub values: BTreeMap<&'static str, String>,
}

impl Defines {
    pub fn flag(mut self, name: &'static str) -> Self {
        self.flags.push(name);
        self.flags.sort();
        self.flags.dedup();
        self
    }
    pub fn flag_if(self, name: &'static str, on: bool) -> Self {
        if on {
            self.flag(name)
        } else {
            self
        }
    }
    pub fn value(mut self, name: &'static str, v: impl ToString) -> Self {
        self.values.insert(name, v.to_string());
        self
    }
    fn has(&self, name: &str) -> bool {
        self.flags.contains(&name)
    }

    /// "F32 GLU ROWS=8": the flags, then the values, for `domino plan`.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self.flags.iter().map(|f| f.to_string()).collect();
        parts.extend(self.values.iter().map(|(k, v)| format!("{k}={v}")));
        parts.join(" ")
    }
}

/// The `@workgroup_size(x[, y[, z]])` of entry point `entry` in a preprocessed source: the attribute
/// nearest before `fn entry(`. Constants named inside it are resolved from `const NAME: u32 = Nu;`.
pub fn workgroup_size(source: &str, entry: &str) -> Option<[u32; 3]> {
    let at = source.find(&format!("fn {entry}("))?;
    let attr = source[..at].rfind("@workgroup_size(")?;
    let args = &source[attr + "@workgroup_size(".len()..];
    let args = &args[..args.find(')')?];
    let mut size = [1u32; 3];
    for (i, a) in args.split(',').map(str::trim).filter(|a| !a.is_empty()).enumerate().take(3) {
        size[i] = resolve_u32(source, a)?;
    }
    Some(size)
}

fn resolve_u32(source: &str, token: &str) -> Option<u32> {
    if token.contains('*') {
        return token.split('*').map(|t| resolve_u32(source, t.trim())).product();
    }
    let literal = token.trim_end_matches('u');
    if let Ok(v) = literal.parse() {
        return Some(v);
    }
    let decl = source.find(&format!("const {token}: u32 = "))? + format!("const {token}: u32 = ").len();
    let value = &source[decl..];
    resolve_u32(source, value[..value.find(';')?].trim())
}

/// Expand `source` for `defines`. `enable f16;` is prepended when the F16 flag is set.
pub fn preprocess(name: &str, source: &str, defines: &Defines) -> Result<String> {
    let err = |line: usize, msg: &str| EngineError::Shader { name: name.to_string(), message: format!("line {}: {msg}", line + 1) };
    // Stack of (this branch active, some branch of this #if already taken, parent active).
    let mut stack: Vec<(bool, bool, bool)> = Vec::new();
    let mut out = String::new();
    if defines.has("F16") {
        out.push_str("enable f16;\n");
    }
    // A condition is `NAME`, `!NAME`, or alternatives joined by `||`.
    let test = |cond: &str| -> bool {
        cond.split("||").any(|term| {
            let term = term.trim();
            match term.strip_prefix('!') {
                Some(n) => !defines.has(n.trim()),
                None => defines.has(term),
            }
        })
    };
    for (i, line) in source.lines().enumerate() {
        let t = line.trim_start();
        let active = stack.last().map(|s| s.0).unwrap_or(true);
        if let Some(cond) = t.strip_prefix("#if ") {
            let c = active && test(cond);
            stack.push((c, c, active));
        } else if let Some(cond) = t.strip_prefix("#elif ") {
            let top = stack.last_mut().ok_or_else(|| err(i, "#elif without #if"))?;
            let c = top.2 && !top.1 && test(cond);
            top.0 = c;
            top.1 |= c;
        } else if t.starts_with("#else") {
            let top = stack.last_mut().ok_or_else(|| err(i, "#else without #if"))?;
            top.0 = top.2 && !top.1;
            top.1 = true;
        } else if t.starts_with("#endif") {
            stack.pop().ok_or_else(|| err(i, "#endif without #if"))?;
        } else if let Some(file) = t.strip_prefix("#include ") {
            if active {
                let (_, text) = INCLUDES.iter().find(|(n, _)| *n == file.trim()).ok_or_else(|| err(i, &format!("#include of unknown file {}", file.trim())))?;
                out.push_str(text);
            }
        } else if active {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !stack.is_empty() {
        return Err(err(source.lines().count(), "unterminated #if"));
    }
    for (k, v) in &defines.values {
        out = out.replace(&format!("{{{{{k}}}}}"), v);
    }
    if let Some(pos) = out.find("{{") {
        let end = out[pos..].find("}}").map(|e| pos + e + 2).unwrap_or(out.len());
        return Err(EngineError::Shader { name: name.to_string(), message: format!("undefined value {}", &out[pos..end]) });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branches_and_values() {
        let src = "a\n#if X\nb\n#elif Y\nc\n#else\nd\n#endif\n#if !X\ne{{N}}\n#endif\n";
        let x = preprocess("t", src, &Defines::default().flag("X")).unwrap();
        assert_eq!(x, "a\nb\n");
        let y = preprocess("t", src, &Defines::default().flag("Y").value("N", 3)).unwrap();
        assert_eq!(y, "a\nc\ne3\n");
        let none = preprocess("t", src, &Defines::default().value("N", 1)).unwrap();
        assert_eq!(none, "a\nd\ne1\n");
        assert!(preprocess("t", "#include rms_scale.wgsl\n", &Defines::default()).unwrap().contains("fn inv_rms"));
        assert!(preprocess("t", "#include nothing.wgsl\n", &Defines::default()).is_err());
        let either = "#if X || Y\nxy\n#endif\n";
        assert_eq!(preprocess("t", either, &Defines::default().flag("Y")).unwrap(), "xy\n");
        assert_eq!(preprocess("t", either, &Defines::default()).unwrap(), "");
        assert!(preprocess("t", "#if X\n", &Defines::default()).is_err());
        assert!(preprocess("t", "{{Q}}", &Defines::default()).is_err());
    }

    #[test]
    fn workgroup_size_of_an_entry() {
        let src = "const L: u32 = 64u;\nconst WG: u32 = L * 1u;\n@compute @workgroup_size(16)\nfn a() {}\n@compute @workgroup_size(WG, 2)\nfn b() {}\n";
        assert_eq!(workgroup_size(src, "a"), Some([16, 1, 1]));
        assert_eq!(workgroup_size(src, "b"), Some([64, 2, 1]));
        assert_eq!(workgroup_size(src, "c"), None);
    }
}
