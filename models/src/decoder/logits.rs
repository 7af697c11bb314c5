//! The output head: the final norm and the output projection (the token
//! embedding when tied) on only the rows each sequence asked for, with the
//! architecture's logit soft-cap.

use candle_core::{DType, Device, Tensor};

use super::Decoder;
use crate::batch::{BatchLayout, LogitsWanted, SeqBatch};
use crate::error::Result;

impl Decoder {
    /// Final norm and output projection, only on the rows the sequences asked for.
    pub(super) fn logits(
        &self,
        x: &Tensor,
        batch: &[SeqBatch<'_>],
        layout: &BatchLayout,
    ) -> Result<Vec<Option<Tensor>>> {
        let mut rows: Vec<u32> = Vec::new();
        let mut spans = Vec::with_capacity(batch.len());
        for (seq, &off) in batch.iter().zip(&layout.offsets) {
            let n = seq.tokens.len();
            let (first, count) = match seq.logits {
                LogitsWanted::None => (off, 0),
                LogitsWanted::Last => (off + n - 1, 1.min(n)),
                LogitsWanted::All => (off, n),
            };
            spans.push((rows.len(), count));
            rows.extend((first..first + count).map(|r| r as u32));
        }
        if rows.is_empty() {
            return Ok(vec![None; batch.len()]);
        }
        let n_rows = rows.len();
        let idx = Tensor::from_vec(rows, n_rows, &Device::Cpu)?;
        let h = x.index_select(&idx, 0)?;
        let h = self.norm(&h, &self.output_norm)?;
        let logits = self
            .output
            .as_ref()
            .unwrap_or(&self.embedding)
            .forward(&h)?
            .to_dtype(DType::F32)?; // [R, vocab]
        let logits = match self.logit_softcap {
            // llama.cpp: scale by 1/cap, tanh, scale by cap, each in f32.
            Some(cap) => {
                let xs: Vec<f32> = logits.flatten_all()?.to_vec1()?;
                let inv = 1.0 / cap;
                let capped: Vec<f32> = xs.iter().map(|&v| (v * inv).tanh() * cap).collect();
                Tensor::from_vec(capped, logits.shape(), logits.device())?
            }
            None => logits,
        };
        spans
            .into_iter()
            .map(|(start, count)| {
                Ok((count > 0)
                    .then(|| logits.narrow(0, start, count))
                    .transpose()?)
            })
            .collect()
    }
}
