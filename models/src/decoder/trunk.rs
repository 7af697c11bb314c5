//! The trunk: a batch's token embeddings and RoPE angles, then every block
//! in turn on the residual stream `[T, D]`, whole ([`Decoder::forward`]) or
//! block by block for a learner that recomputes each block in its backward
//! pass ([`Decoder::trunk_start`], [`Decoder::trunk_layer`]).

use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::rotation::RopeTable;
use super::Decoder;
use crate::batch::{plan, BatchLayout, SeqBatch};
use crate::error::Result;
use crate::lora::LoraSet;
use crate::weight::Precision;

/// What every block of one batch reads besides the residual stream: where
/// each sequence sits and the RoPE angles ([`Decoder::trunk_start`]).
pub struct Trunk {
    layout: BatchLayout,
    rows: TrunkRows,
}

/// The batch's RoPE angles for global and (if any) sliding-window layers.
pub(super) struct TrunkRows {
    global: RopeRows,
    local: Option<RopeRows>,
}

/// One table's angles for a batch's rows, shared with the learner's ops.
type Angles = Arc<Vec<f32>>;

/// One batch's RoPE angles from one pair of tables.
pub(super) struct RopeRows {
    /// `[T, hd/2]` f32.
    pub(super) cos: Tensor,
    /// `[T, hd/2]` f32.
    pub(super) sin: Tensor,
    /// The same, read out for serving's loops.
    pub(super) angles: Option<(Angles, Angles)>,
}

impl Decoder {
    /// Starts a forward pass block by block (a learner that recomputes each
    /// block in its backward pass): the embeddings `[T, D]` and what every
    /// block of this batch reads.
    pub fn trunk_start(&self, batch: &mut [SeqBatch<'_>]) -> Result<(Tensor, Trunk)> {
        let layout = plan(&self.config, batch)?;
        let (x, rows) = self.embed(batch, &layout)?;
        Ok((x, Trunk { layout, rows }))
    }

    /// Block `layer` of a pass [`Decoder::trunk_start`] began, on the residual
    /// stream `x` `[T, D]`; the caches see the layer's keys as a whole pass would.
    pub fn trunk_layer(
        &self,
        layer: usize,
        x: &Tensor,
        trunk: &Trunk,
        batch: &mut [SeqBatch<'_>],
        adapters: Option<&LoraSet>,
    ) -> Result<Tensor> {
        self.layer(layer, x, &trunk.rows, batch, &trunk.layout, adapters)
    }

    /// Embedding and every block: the residual stream `[T, D]`.
    pub(super) fn trunk(
        &self,
        batch: &mut [SeqBatch<'_>],
        layout: &BatchLayout,
        adapters: Option<&LoraSet>,
    ) -> Result<Tensor> {
        let (mut x, rows) = self.embed(batch, layout)?;
        for layer in 0..self.blocks.len() {
            x = self.layer(layer, &x, &rows, batch, layout, adapters)?;
        }
        Ok(x)
    }

    /// One block with the RoPE angles of its kind (global or sliding).
    fn layer(
        &self,
        layer: usize,
        x: &Tensor,
        rows: &TrunkRows,
        batch: &mut [SeqBatch<'_>],
        layout: &BatchLayout,
        adapters: Option<&LoraSet>,
    ) -> Result<Tensor> {
        let rope = match (&rows.local, self.sliding_window(layer)) {
            (Some(local), Some(_)) => local,
            _ => &rows.global,
        };
        self.block_forward(layer, &self.blocks[layer], x, rope, batch, layout, adapters)
    }

    /// The token embeddings of the batch and its RoPE angles.
    fn embed(&self, batch: &[SeqBatch<'_>], layout: &BatchLayout) -> Result<(Tensor, TrunkRows)> {
        let ids: Vec<u32> = batch
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        let n_tokens = ids.len();
        let positions = Tensor::from_vec(layout.positions.clone(), n_tokens, &Device::Cpu)?;
        let global = self.rope_rows(&self.rope.global, &positions)?;
        let local = match &self.rope.local {
            Some(table) => Some(self.rope_rows(table, &positions)?),
            None => None,
        };

        let mut x = self.embedding.rows(&ids)?; // [T, D]
        if self.features.embed_scale {
            // After the lookup, in f32, as llama.cpp scales the rows.
            let s = (self.config.n_embd as f32).sqrt();
            let xs: Vec<f32> = x.flatten_all()?.to_vec1()?;
            let scaled: Vec<f32> = xs.iter().map(|&v| v * s).collect();
            x = Tensor::from_vec(scaled, x.shape(), x.device())?;
        }
        Ok((x, TrunkRows { global, local }))
    }

    /// The angles of the batch's positions from one pair of RoPE tables.
    fn rope_rows(&self, table: &RopeTable, positions: &Tensor) -> Result<RopeRows> {
        let cos = table.cos.index_select(positions, 0)?; // [T, hd/2]
        let sin = table.sin.index_select(positions, 0)?;
        // Serving rotates with plain loops (see `exact`): the rows' angles
        // read out once for every layer.
        let angles = match self.precision {
            Precision::Quantized => Some((
                Arc::new(cos.flatten_all()?.to_vec1::<f32>()?),
                Arc::new(sin.flatten_all()?.to_vec1::<f32>()?),
            )),
            Precision::DenseF32 => None,
        };
        Ok(RopeRows { cos, sin, angles })
    }
}
