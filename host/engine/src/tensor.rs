//! Weight matrices: bf16, row-major `[rows, cols]`, either borrowed straight
//! from a memory-mapped safetensors file, owned (generated weights), or
//! dequantized from block-FP8 weights (kept raw beside their bf16 copy).

use crate::fp8::Fp8Tensor;
use half::bf16;
use memmap2::Mmap;
use std::borrow::Cow;
use std::sync::Arc;

/// Where a tensor's bf16 elements live.
pub enum Storage {
    /// A memory-mapped file; `offset` is the byte offset of the tensor data.
    Mapped {
        map: Arc<Mmap>,
        offset: usize,
        len: usize,
    },
    Owned(Vec<bf16>),
    /// Block-FP8 weights, dequantized to bf16 on first use of [`Storage::as_slice`].
    Fp8(Fp8Tensor),
}

impl Storage {
    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            Storage::Mapped { len, .. } => *len,
            Storage::Owned(v) => v.len(),
            Storage::Fp8(t) => t.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_slice(&self) -> &[bf16] {
        match self {
            Storage::Mapped { map, offset, len } => {
                let bytes = &map[*offset..*offset + len * 2];
                // SAFETY: bf16 is a plain 2-byte value with no invalid bit
                // patterns; the loader only maps tensors whose data is 2-byte
                // aligned (it copies the others into owned storage).
                let (head, body, tail) = unsafe { bytes.align_to::<bf16>() };
                debug_assert!(head.is_empty() && tail.is_empty());
                body
            }
            Storage::Owned(v) => v,
            Storage::Fp8(t) => t.dequantized(),
        }
    }
}

/// A `[rows, cols]` bf16 matrix view; cheap to clone (shares its storage).
#[derive(Clone)]
pub struct Mat {
    pub rows: usize,
    pub cols: usize,
    storage: Arc<Storage>,
    /// Element offset of row 0 within the storage (expert slices of a fused tensor).
    start: usize,
}

impl Mat {
    pub fn new(rows: usize, cols: usize, storage: Arc<Storage>, start: usize) -> Self {
        assert!(start + rows * cols <= storage.len());
        Mat {
            rows,
            cols,
            storage,
            start,
        }
    }

    pub fn from_vec(rows: usize, cols: usize, data: Vec<bf16>) -> Self {
        assert_eq!(data.len(), rows * cols);
        Mat::new(rows, cols, Arc::new(Storage::Owned(data)), 0)
    }

    pub fn data(&self) -> &[bf16] {
        &self.storage.as_slice()[self.start..self.start + self.rows * self.cols]
    }

    pub fn row(&self, r: usize) -> &[bf16] {
        let d = self.storage.as_slice();
        let s = self.start + r * self.cols;
        &d[s..s + self.cols]
    }

    /// Rows `[first, first + count)` as a matrix sharing the storage.
    pub fn rows_slice(&self, first: usize, count: usize) -> Mat {
        assert!(first + count <= self.rows);
        Mat {
            rows: count,
            cols: self.cols,
            storage: self.storage.clone(),
            start: self.start + first * self.cols,
        }
    }

    /// Splits a `[n * rows_each, cols]` stack into `n` matrices (fused expert tensors).
    pub fn split_rows(&self, n: usize) -> Vec<Mat> {
        assert_eq!(self.rows % n, 0);
        let each = self.rows / n;
        (0..n).map(|i| self.rows_slice(i * each, each)).collect()
    }

    /// The elements for a copy elsewhere (a device upload): FP8 weights not yet
    /// dequantized on the host are dequantized into a temporary, so uploading
    /// a model holds one matrix in bf16 at a time rather than all of them.
    pub fn host_bf16(&self) -> Cow<'_, [bf16]> {
        match &*self.storage {
            Storage::Fp8(t) if t.cached().is_none() => {
                Cow::Owned(t.dequantize_rows(self.start / self.cols, self.rows))
            }
            _ => Cow::Borrowed(self.data()),
        }
    }

    /// The raw block-FP8 tensor behind this matrix and the global row (slabs
    /// stacked) of its row 0, when it was loaded from FP8 weights.
    pub fn fp8(&self) -> Option<(&Fp8Tensor, usize)> {
        match &*self.storage {
            Storage::Fp8(t) => Some((t, self.start / self.cols)),
            _ => None,
        }
    }

    /// This matrix's raw E4M3 bytes and block scales (see
    /// [`Fp8Tensor::block_rows`]) when it was loaded from FP8 weights and its
    /// rows are whole 128-row blocks.
    pub fn fp8_blocks(&self) -> Option<(&[u8], &[f32])> {
        let (t, first) = self.fp8()?;
        t.block_rows(first, self.rows)
    }

    pub fn bytes(&self) -> usize {
        self.rows * self.cols * 2
    }
}
