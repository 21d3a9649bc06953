//! GGML block quantization as GGUF files store it. Types of 32-value blocks (Q8_0, Q4_0, Q4_1, Q5_0,
//! Q5_1: one f16 scale, and for the _1 types an f16 minimum, per block) and K-quants of 256-value
//! super-blocks (Q4_K, Q5_K: eight 32-value sub-blocks with 6-bit scales and minimums under an f16
//! d and dmin; Q6_K: sixteen 16-value sub-blocks with i8 scales under an f16 d).
//!
//! This module holds the exact CPU dequantization (llama.cpp's dequantize_row_*, the reference the GPU
//! kernels are tested against), quantization from floats with llama.cpp's reference rounding
//! (quantize_row_*_ref: for `--dtype q4_k` and friends and for test files), and the repacking into
//! the GPU layouts: every type is cut into 32-value *units* (a block, or a K-quant sub-block pair)
//! whose integer codes, 16-bit unit scale and super-block word the kernels read (`Unit`).
//!
//! Dequantized values are exact in f32 on both sides: q·d is a small integer times an f16 (fits in
//! 24 bits of mantissa); the K-quants' d·sc is an f16 times a 6- or 8-bit integer (exact), times a
//! code of at most 6 bits (exact for Q6_K: 11 + 7 + 5 bits), and the _1 / K types' final minus or
//! plus rounds once whether or not it is fused. So CPU and GPU see bit-identical weights; only the
//! accumulation order of the matmul differs.

use half::f16;

/// Values per unit: a block of the 32-value types, a sub-block (pair) of the K-quants.
pub const QK: usize = 32;
/// Values per K-quant super-block.
pub const QK_K: usize = 256;
/// Output columns per GPU group (matmul.wgsl's 16-column blocks).
pub const GROUP_COLS: usize = 16;

/// GGML's names (Q4_K, not Q4K), as files and tools spell them.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4_K,
    Q5_K,
    Q6_K,
}

/// One 32-value unit of a block, as the GPU layouts store it: the integer codes (before any offset),
/// the unit's 16-bit scale field and, for K-quants, its super-block's word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unit {
    /// Q8_0: the i8 as a byte; Q4_x: 0..16; Q5_x: 0..32; Q6_K: 0..64.
    pub codes: [u8; QK],
    /// f16 bits of d (32-value types); K4/K5: sc | m << 8 (6 bits each); Q6_K: the two i8 scales of
    /// the unit's 16-value halves, low byte first.
    pub scale: u16,
    /// Q4_1 / Q5_1: f16 bits of the minimum; else 0.
    pub min: u16,
    /// K-quants: f16 d | f16 dmin << 16 (Q6_K: dmin 0); else 0.
    pub super_word: u32,
}

impl QuantType {
    pub const ALL: [QuantType; 8] = [Self::Q8_0, Self::Q4_0, Self::Q4_1, Self::Q5_0, Self::Q5_1, Self::Q4_K, Self::Q5_K, Self::Q6_K];

    pub fn name(self) -> &'static str {
        match self {
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
            Self::Q5_0 => "q5_0",
            Self::Q5_1 => "q5_1",
            Self::Q4_K => "q4_k",
            Self::Q5_K => "q5_k",
            Self::Q6_K => "q6_k",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == s.to_ascii_lowercase())
    }

    /// Whether this is a K-quant (256-value super-blocks).
    pub fn is_k(self) -> bool {
        matches!(self, Self::Q4_K | Self::Q5_K | Self::Q6_K)
    }

    /// Values per block: 32, or 256 for the K-quants.
    pub fn block_values(self) -> usize {
        if self.is_k() {
            QK_K
        } else {
            QK
        }
    }

    /// 32-value units per block.
    pub fn units(self) -> usize {
        self.block_values() / QK
    }

    /// Bytes of one block on disk.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q8_0 => 2 + QK,
            Self::Q4_0 => 2 + QK / 2,
            Self::Q4_1 => 4 + QK / 2,
            Self::Q5_0 => 2 + 4 + QK / 2,
            Self::Q5_1 => 4 + 4 + QK / 2,
            Self::Q4_K => 4 + 12 + QK_K / 2,
            Self::Q5_K => 4 + 12 + QK_K / 8 + QK_K / 2,
            Self::Q6_K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
        }
    }

    /// u32 words of one unit's low codes in the GPU layouts: Q8_0 8 (4 bytes each), else 4 (8
    /// nibbles each, value 8j + e at bits 4e of word j).
    pub fn quant_words(self) -> usize {
        if self == Self::Q8_0 {
            QK / 4
        } else {
            QK / 8
        }
    }

    /// u32 words of one unit's high code bits: Q5_x 1 (bit i is bit 4 of value i), Q6_K 2 (value i's
    /// two high bits at bits 2 (i % 16) of word i / 16), else 0.
    pub fn high_words(self) -> usize {
        match self {
            Self::Q5_0 | Self::Q5_1 | Self::Q5_K => 1,
            Self::Q6_K => 2,
            _ => 0,
        }
    }

    /// u32 words of one CPU-family group (16 columns x one block, matmul_quant.wgsl's WORDS): the
    /// low codes of every unit and column, their high bits, then the scales: one f16 per column
    /// (and as many minimums for the _1 types), or for K-quants a 16-bit field per unit and column
    /// and a super-block word per column.
    pub fn gpu_group_words(self) -> usize {
        let u = self.units();
        let scales = match self {
            Self::Q4_1 | Self::Q5_1 => GROUP_COLS,
            t if t.is_k() => u * GROUP_COLS / 2 + GROUP_COLS,
            _ => GROUP_COLS / 2,
        };
        GROUP_COLS * u * (self.quant_words() + self.high_words()) + scales
    }

    /// Exact dequantization of one block (llama.cpp's dequantize_row_*).
    pub fn dequantize_block(self, b: &[u8], out: &mut [f32]) {
        let h = |i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
        match self {
            Self::Q8_0 => {
                let d = h(0);
                for (o, &q) in out.iter_mut().zip(&b[2..2 + QK]) {
                    *o = (q as i8) as f32 * d;
                }
            }
            Self::Q4_0 => {
                let d = h(0);
                for (i, o) in out.iter_mut().enumerate().take(QK) {
                    *o = (nibble(&b[2..], i) as i32 - 8) as f32 * d;
                }
            }
            Self::Q4_1 => {
                let (d, m) = (h(0), h(2));
                for (i, o) in out.iter_mut().enumerate().take(QK) {
                    *o = nibble(&b[4..], i) as f32 * d + m;
                }
            }
            Self::Q5_0 => {
                let d = h(0);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                for (i, o) in out.iter_mut().enumerate().take(QK) {
                    *o = ((nibble(&b[6..], i) as u32 | ((qh >> i) & 1) << 4) as i32 - 16) as f32 * d;
                }
            }
            Self::Q5_1 => {
                let (d, m) = (h(0), h(2));
                let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                for (i, o) in out.iter_mut().enumerate().take(QK) {
                    *o = (nibble(&b[8..], i) as u32 | ((qh >> i) & 1) << 4) as f32 * d + m;
                }
            }
            Self::Q4_K | Self::Q5_K => {
                let (d, dmin) = (h(0), h(2));
                let scales = &b[4..16];
                let (qh, qs) = if self == Self::Q5_K { (&b[16..48], &b[48..176]) } else { (&b[0..0], &b[16..144]) };
                for j in 0..QK_K / QK {
                    let (sc, m) = scale_min_k4(j, scales);
                    let (d1, m1) = (d * sc as f32, dmin * m as f32);
                    for l in 0..QK {
                        // Sub-blocks 2c and 2c + 1 share 32 bytes: low and high nibbles.
                        let byte = qs[(j / 2) * 32 + l];
                        let mut q = if j % 2 == 0 { byte & 0x0f } else { byte >> 4 } as u32;
                        if self == Self::Q5_K {
                            q |= ((qh[l] >> j) as u32 & 1) << 4;
                        }
                        out[j * QK + l] = d1 * q as f32 - m1;
                    }
                }
            }
            Self::Q6_K => {
                let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
                let d = h(208);
                for i in 0..QK_K {
                    let (ql, qh, sc) = (&ql[(i / 128) * 64..], &qh[(i / 128) * 32..], &sc[(i / 128) * 8..]);
                    let (part, l) = ((i % 128) / 32, i % 32);
                    let low = match part {
                        0 => ql[l] & 0x0f,
                        1 => ql[l + 32] & 0x0f,
                        2 => ql[l] >> 4,
                        _ => ql[l + 32] >> 4,
                    };
                    let q = (low | ((qh[l] >> (2 * part)) & 3) << 4) as i32 - 32;
                    out[i] = d * (sc[l / 16 + 2 * part] as i8) as f32 * q as f32;
                }
            }
        }
    }

    /// Quantize one block with llama.cpp's reference rounding (quantize_row_*_ref).
    pub fn quantize_block(self, v: &[f32], out: &mut [u8]) {
        match self {
            Self::Q8_0 => {
                let amax = v.iter().fold(0f32, |a, x| a.max(x.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                for (o, x) in out[2..2 + QK].iter_mut().zip(v) {
                    *o = ((x * id).round() as i32).clamp(-128, 127) as i8 as u8;
                }
            }
            Self::Q4_0 | Self::Q5_0 => {
                // The value of largest magnitude maps to the lowest code, keeping its sign.
                let levels = if self == Self::Q4_0 { 16.0f32 } else { 32.0 };
                let max = v.iter().fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
                let d = max / -(levels / 2.0);
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                // (int8_t)(x + 8.5f) truncates toward zero, then MIN(top, ..).
                let q = |x: f32| ((x * id + levels / 2.0 + 0.5) as i8 as i32).min(levels as i32 - 1) as u8;
                write_codes(self, &mut out[2..], &(0..QK).map(|i| q(v[i])).collect::<Vec<_>>());
            }
            Self::Q4_1 | Self::Q5_1 => {
                let levels = if self == Self::Q4_1 { 15.0f32 } else { 31.0 };
                let min = v.iter().copied().fold(f32::MAX, f32::min);
                let max = v.iter().copied().fold(-f32::MAX, f32::max);
                let d = (max - min) / levels;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                out[2..4].copy_from_slice(&f16::from_f32(min).to_le_bytes());
                let q = |x: f32| {
                    let c = ((x - min) * id + 0.5) as u8 as i32;
                    if self == Self::Q4_1 {
                        c.min(15) as u8
                    } else {
                        c as u8
                    }
                };
                write_codes(self, &mut out[4..], &(0..QK).map(|i| q(v[i])).collect::<Vec<_>>());
            }
            Self::Q4_K | Self::Q5_K => quantize_k45(self, v, out),
            Self::Q6_K => quantize_q6_k(v, out),
        }
    }

    /// Unit `u` (0..units()) of a disk block.
    pub fn unit(self, b: &[u8], u: usize) -> Unit {
        let h16 = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let mut codes = [0u8; QK];
        let scale: u16;
        let (mut min, mut super_word) = (0u16, 0u32);
        match self {
            Self::Q8_0 => {
                codes.copy_from_slice(&b[2..2 + QK]);
                scale = h16(0);
            }
            Self::Q4_0 | Self::Q4_1 => {
                let at = if self == Self::Q4_0 { 2 } else { 4 };
                for (i, c) in codes.iter_mut().enumerate() {
                    *c = nibble(&b[at..], i);
                }
                scale = h16(0);
                min = if self == Self::Q4_1 { h16(2) } else { 0 };
            }
            Self::Q5_0 | Self::Q5_1 => {
                let at = if self == Self::Q5_0 { 2 } else { 4 };
                let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
                for (i, c) in codes.iter_mut().enumerate() {
                    *c = nibble(&b[at + 4..], i) | (((qh >> i) & 1) << 4) as u8;
                }
                scale = h16(0);
                min = if self == Self::Q5_1 { h16(2) } else { 0 };
            }
            Self::Q4_K | Self::Q5_K => {
                let (sc, m) = scale_min_k4(u, &b[4..16]);
                scale = sc as u16 | (m as u16) << 8;
                super_word = h16(0) as u32 | (h16(2) as u32) << 16;
                let (qh, qs) = if self == Self::Q5_K { (&b[16..48], &b[48..176]) } else { (&b[0..0], &b[16..144]) };
                for (l, c) in codes.iter_mut().enumerate() {
                    let byte = qs[(u / 2) * 32 + l];
                    *c = if u.is_multiple_of(2) { byte & 0x0f } else { byte >> 4 };
                    if self == Self::Q5_K {
                        *c |= ((qh[l] >> u) & 1) << 4;
                    }
                }
            }
            Self::Q6_K => {
                let (ql, qh, sc) = (&b[(u / 4) * 64..], &b[128 + (u / 4) * 32..], &b[192 + (u / 4) * 8..]);
                let part = u % 4;
                for (l, c) in codes.iter_mut().enumerate() {
                    let low = match part {
                        0 => ql[l] & 0x0f,
                        1 => ql[l + 32] & 0x0f,
                        2 => ql[l] >> 4,
                        _ => ql[l + 32] >> 4,
                    };
                    *c = low | ((qh[l] >> (2 * part)) & 3) << 4;
                }
                scale = sc[2 * part] as u16 | (sc[2 * part + 1] as u16) << 8;
                super_word = h16(208) as u32;
            }
        }
        Unit { codes, scale, min, super_word }
    }

    /// Unit `u`'s low-code word `j` (0..quant_words()): 4 bytes (Q8_0) or 8 nibbles, in value order.
    pub fn low_word(self, unit: &Unit, j: usize) -> u32 {
        if self == Self::Q8_0 {
            u32::from_le_bytes([unit.codes[4 * j], unit.codes[4 * j + 1], unit.codes[4 * j + 2], unit.codes[4 * j + 3]])
        } else {
            (0..8).fold(0, |w, e| w | ((unit.codes[8 * j + e] & 0x0f) as u32) << (4 * e))
        }
    }

    /// Unit `u`'s high-bit word `h` (0..high_words()).
    pub fn high_word(self, unit: &Unit, h: usize) -> u32 {
        match self {
            Self::Q6_K => (0..16).fold(0, |w, i| w | ((unit.codes[16 * h + i] >> 4) as u32 & 3) << (2 * i)),
            _ => (0..QK).fold(0, |w, i| w | ((unit.codes[i] >> 4) as u32 & 1) << i),
        }
    }

    /// Write one disk block, column `c` (0..16) of a CPU-family group, into the group's words
    /// (layout in `gpu_group_words`; matmul_quant.wgsl reads it).
    pub fn pack_gpu(self, b: &[u8], c: usize, group: &mut [u32]) {
        let (units, qw, hw) = (self.units(), self.quant_words(), self.high_words());
        let high_base = GROUP_COLS * units * qw;
        let scale_base = GROUP_COLS * units * (qw + hw);
        let set_half = |group: &mut [u32], word: usize, bits: u16| {
            let shift = 16 * (c % 2);
            group[word] = (group[word] & !(0xffff << shift)) | ((bits as u32) << shift);
        };
        for s in 0..units {
            let unit = self.unit(b, s);
            for j in 0..qw {
                group[(s * qw + j) * GROUP_COLS + c] = self.low_word(&unit, j);
            }
            for h in 0..hw {
                group[high_base + (s * hw + h) * GROUP_COLS + c] = self.high_word(&unit, h);
            }
            if self.is_k() {
                set_half(group, scale_base + s * GROUP_COLS / 2 + c / 2, unit.scale);
                group[scale_base + units * GROUP_COLS / 2 + c] = unit.super_word;
            } else {
                set_half(group, scale_base + c / 2, unit.scale);
                if matches!(self, Self::Q4_1 | Self::Q5_1) {
                    set_half(group, scale_base + GROUP_COLS / 2 + c / 2, unit.min);
                }
            }
        }
    }
}

/// Value i (0..32) of a 16-byte block of nibbles: low nibbles hold 0..16, high nibbles 16..32.
fn nibble(qs: &[u8], i: usize) -> u8 {
    if i < QK / 2 {
        qs[i] & 0x0f
    } else {
        qs[i - QK / 2] >> 4
    }
}

/// Store 32 codes of a 32-value type from byte `at` of `out`: Q4_x nibbles (value j low, j + 16
/// high); Q5_x first the 4 bytes of fifth bits (qh), then the nibbles.
fn write_codes(t: QuantType, out: &mut [u8], codes: &[u8]) {
    let (qh_len, qs) = if matches!(t, QuantType::Q5_0 | QuantType::Q5_1) { (4, 4) } else { (0, 0) };
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        out[qs + j] = (codes[j] & 0x0f) | ((codes[j + QK / 2] & 0x0f) << 4);
        qh |= ((codes[j] >> 4) as u32 & 1) << j | ((codes[j + QK / 2] >> 4) as u32 & 1) << (j + QK / 2);
    }
    if qh_len > 0 {
        out[..4].copy_from_slice(&qh.to_le_bytes());
    }
}

/// The 6-bit scale and minimum of sub-block j of a Q4_K / Q5_K block (get_scale_min_k4).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// llama.cpp's nearest_int: round half to even through the float's mantissa.
fn nearest_int(v: f32) -> i32 {
    let val = v + 12582912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// make_qkx2_quants: codes in 0..=nmax and (scale, the_min) minimising the weighted error.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(nmax: i32, x: &[f32], weights: &[f32], l_out: &mut [u8], rmin: f32, rdelta: f32, nstep: i32) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.iter_mut().for_each(|l| *l = 0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    let mut laux = vec![0u8; n];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let w = weights[i];
            sum_l += w * l as f32;
            sum_l2 += w * l as f32 * l as f32;
            sum_xl += w * l as f32 * x[i];
        }
        let dd = sum_w * sum_l2 - sum_l * sum_l;
        if dd > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / dd;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / dd;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if cur_error < best_error {
                l_out.copy_from_slice(&laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// make_qx_quants with rmse_type 1 and no importance weights: signed codes in -nmax..nmax-1.
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < 1e-15 {
        l_out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (i, &v) in x.iter().enumerate() {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        l_out[i] = (l + nmax) as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
            let w = v * v;
            sumlx += w * v * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (i, &v) in x.iter().enumerate() {
                l_out[i] = (nmax + nearest_int(iscale * v).clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// quantize_row_q4_K_ref / quantize_row_q5_K_ref for one super-block.
fn quantize_k45(t: QuantType, x: &[f32], y: &mut [u8]) {
    let five = t == QuantType::Q5_K;
    let nmax = if five { 31 } else { 15 };
    let (rmin, rdelta, nstep) = if five { (-0.5, 0.1, 15) } else { (-1.0, 0.1, 20) };
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2: f32 = xs.iter().fold(0.0, |a, v| a + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: Vec<f32> = xs.iter().map(|v| av_x + v.abs()).collect();
        let (s, m) = make_qkx2_quants(nmax, xs, &weights, &mut l[32 * j..32 * j + 32], rmin, rdelta, nstep);
        scales[j] = s;
        mins[j] = m;
        max_scale = max_scale.max(s);
        max_min = max_min.max(m);
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut y[4..16];
    sc.iter_mut().for_each(|b| *b = 0);
    for j in 0..8 {
        // uint8_t ls = nearest_int(..): the C conversion keeps the low 8 bits.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0x0f) | ((lm & 0x0f) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);
    y[0..2].copy_from_slice(&d.to_le_bytes());
    y[2..4].copy_from_slice(&dmin.to_le_bytes());
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, &y[4..16]);
        let dj = d.to_f32() * s as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    if five {
        let (qh, ql) = y[16..176].split_at_mut(32);
        qh.iter_mut().for_each(|b| *b = 0);
        let (mut m1, mut m2) = (1u8, 2u8);
        for n in (0..QK_K).step_by(64) {
            for j in 0..32 {
                let mut l1 = l[n + j];
                if l1 > 15 {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                let mut l2 = l[n + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[n / 2 + j] = l1 | (l2 << 4);
            }
            m1 <<= 2;
            m2 <<= 2;
        }
    } else {
        for n in (0..QK_K).step_by(64) {
            for j in 0..32 {
                y[16 + n / 2 + j] = l[n + j] | (l[n + j + 32] << 4);
            }
        }
    }
}

/// quantize_row_q6_K_ref for one super-block.
fn quantize_q6_k(x: &[f32], y: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for ib in 0..16 {
        let s = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
        scales[ib] = s;
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
        }
    }
    y.iter_mut().for_each(|b| *b = 0);
    if max_abs_scale < 1e-15 {
        return;
    }
    let iscale = -128.0 / max_scale;
    let d = f16::from_f32(1.0 / iscale);
    y[208..210].copy_from_slice(&d.to_le_bytes());
    for ib in 0..16 {
        y[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    for j in 0..16 {
        let dj = d.to_f32() * (y[192 + j] as i8) as f32;
        if dj == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = (nearest_int(x[16 * j + ii] / dj).clamp(-32, 31) + 32) as i8;
        }
    }
    for j in (0..QK_K).step_by(128) {
        let (ql, qh) = (j / 2, 128 + j / 4);
        for i in 0..32 {
            let q = |o: usize| l[j + i + o] as u8;
            y[ql + i] = (q(0) & 0x0f) | ((q(64) & 0x0f) << 4);
            y[ql + i + 32] = (q(32) & 0x0f) | ((q(96) & 0x0f) << 4);
            y[qh + i] = (q(0) >> 4) | ((q(32) >> 4) << 2) | ((q(64) >> 4) << 4) | ((q(96) >> 4) << 6);
        }
    }
}

/// Quantize a row-major `[rows][cols]` f32 matrix (cols a multiple of the block size) into blocks.
pub fn quantize(t: QuantType, values: &[f32]) -> Vec<u8> {
    let bv = t.block_values();
    let mut out = vec![0u8; values.len() / bv * t.block_bytes()];
    for (v, o) in values.chunks_exact(bv).zip(out.chunks_exact_mut(t.block_bytes())) {
        t.quantize_block(v, o);
    }
    out
}

/// Dequantize blocks into f32 values.
pub fn dequantize(t: QuantType, bytes: &[u8]) -> Vec<f32> {
    let bv = t.block_values();
    let mut out = vec![0f32; bytes.len() / t.block_bytes() * bv];
    for (b, o) in bytes.chunks_exact(t.block_bytes()).zip(out.chunks_exact_mut(bv)) {
        t.dequantize_block(b, o);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..QK * 8)
            .map(|_| {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                ((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 3.0
            })
            .collect()
    }

    #[test]
    fn quantize_then_dequantize_is_close_and_requantizing_is_exact() {
        for t in [QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1, QuantType::Q5_0, QuantType::Q5_1] {
            let v = values(7);
            let q = quantize(t, &v);
            let d = dequantize(t, &q);
            // Values lie in [-1.5, 1.5). Rounding error is half a step, except for the _0 types, whose
            // grid (q - 8)·d stops one step short on the side opposite the largest magnitude.
            let bound = match t {
                QuantType::Q8_0 => 0.5 * 1.5 / 127.0,
                QuantType::Q4_0 => 1.5 / 8.0,
                QuantType::Q5_0 => 1.5 / 16.0,
                QuantType::Q4_1 => 0.5 * 3.0 / 15.0,
                _ => 0.5 * 3.0 / 31.0,
            };
            for (a, b) in v.iter().zip(&d) {
                assert!((a - b).abs() <= bound * 1.01 + 1e-3, "{t:?}: {a} vs {b}");
            }
            // Dequantized values lie on the grid: quantizing them again reproduces the blocks.
            assert_eq!(dequantize(t, &quantize(t, &d)), d, "{t:?}");
        }
    }

    #[test]
    fn units_carry_every_code_and_scale() {
        // Rebuilding each value from its unit (as the kernels do) gives the exact dequantization.
        let v: Vec<f32> = (0..4).flat_map(|s| values(s + 11)).collect();
        for t in QuantType::ALL {
            let bytes = quantize(t, &v);
            let want = dequantize(t, &bytes);
            let h = |bits: u32| f16::from_bits(bits as u16).to_f32();
            for (bi, b) in bytes.chunks_exact(t.block_bytes()).enumerate() {
                for u in 0..t.units() {
                    let unit = t.unit(b, u);
                    for (i, &code) in unit.codes.iter().enumerate() {
                        let q = code as f32;
                        let got = match t {
                            QuantType::Q8_0 => (code as i8) as f32 * h(unit.scale as u32),
                            QuantType::Q4_0 => (q - 8.0) * h(unit.scale as u32),
                            QuantType::Q5_0 => (q - 16.0) * h(unit.scale as u32),
                            QuantType::Q4_1 | QuantType::Q5_1 => q * h(unit.scale as u32) + h(unit.min as u32),
                            QuantType::Q4_K | QuantType::Q5_K => {
                                let d1 = h(unit.super_word) * (unit.scale & 0xff) as f32;
                                let m1 = h(unit.super_word >> 16) * (unit.scale >> 8) as f32;
                                d1 * q - m1
                            }
                            QuantType::Q6_K => {
                                let sc = if i < 16 { unit.scale as u8 } else { (unit.scale >> 8) as u8 } as i8;
                                h(unit.super_word) * sc as f32 * (q - 32.0)
                            }
                        };
                        let at = bi * t.block_values() + u * QK + i;
                        assert_eq!(got.to_bits(), want[at].to_bits(), "{t:?} block {bi} unit {u} value {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn q4_nibble_order_follows_ggml() {
        // Byte j holds value j (low nibble) and value j + 16 (high nibble).
        let mut b = vec![0u8; QuantType::Q4_0.block_bytes()];
        b[..2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        b[2] = 0x3a; // value 0 = 0xa - 8 = 2, value 16 = 0x3 - 8 = -5
        let mut out = [0f32; QK];
        QuantType::Q4_0.dequantize_block(&b, &mut out);
        assert_eq!((out[0], out[16], out[1]), (2.0, -5.0, -8.0));
    }
}
