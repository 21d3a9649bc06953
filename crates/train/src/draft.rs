//! Drafting one block with the burn module, as the engine drafts (spec §3, §5): the cross-check
//! between training and inference code runs this against the engine's drafters on the same weights.

use crate::model::{Dims, DrafterNet, Target};
use burn::tensor::{Tensor, TensorData};

/// Drafts and the logits they are the argmax of (`[B][V]`, base plus correction on corrected slots).
#[derive(Debug, Clone)]
pub struct Drafted {
    pub drafts: Vec<u32>,
    pub base_logits: Vec<f32>,
    pub final_logits: Vec<f32>,
}

fn argmax(row: &[f32]) -> u32 {
    // The lowest index wins ties, as in the engine.
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

fn to_vec(t: Tensor<3>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap_or_default()
}

/// Draft the block anchored at `start` with context features `[start][k·h]` (f32, row-major).
/// `use_head` false runs a Domino drafter as its backbone only (the --no-head ablation).
pub fn draft_block(net: &DrafterNet, dims: &Dims, target: &Target, features: &[f32], anchor: u32, start: usize, use_head: bool) -> Drafted {
    let device = target.embed.device();
    let width = features.len() / start.max(1);
    let f = Tensor::<2>::from_data(TensorData::new(features.to_vec(), [start, width]), &device);
    let out = net.forward(dims, target, f.clone(), &[start], &[anchor], None);
    let (b, v) = (dims.block, dims.vocab);
    let base = to_vec(out.base.clone());
    let head = net.head.as_ref().filter(|_| use_head && dims.shift_label);
    let Some(head) = head else {
        let skip = usize::from(!dims.shift_label);
        let drafts = base.chunks(v).skip(skip).map(argmax).collect();
        return Drafted { drafts, final_logits: base.clone(), base_logits: base };
    };
    // Slot i's correction needs the GRU over [anchor, d1, …, d_i]: re-run the teacher-forced head on
    // the drafts chosen so far (later entries are placeholders slot i does not read).
    let mut fin = base.clone();
    let mut tokens = vec![anchor; b];
    let mut drafts = Vec::with_capacity(b);
    for i in 0..b {
        if i >= dims.prefix_len {
            let corr = to_vec(head.teacher_forced(dims, target, out.y.clone(), &[tokens.clone()]));
            for c in 0..v {
                fin[i * v + c] = base[i * v + c] + corr[i * v + c];
            }
        }
        let d = argmax(&fin[i * v..(i + 1) * v]);
        drafts.push(d);
        if i + 1 < b {
            tokens[i + 1] = d;
        }
    }
    Drafted { drafts, base_logits: base, final_logits: fin }
}
