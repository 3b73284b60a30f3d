//! The weighted readout of many logits rows at once (issue 23): the rows of
//! a batched step that draw from the whole distribution
//! ([`crate::backend::Want::Weighted`]) read back together instead of one
//! after another.
//!
//! One launch each of the head kernels and of `logits_weights` over all the
//! rows (`kernels/sampling.cu`: launch row y reads logits row `rows[y]`, at
//! its own temperature and min-p from a small table uploaded beside it), one
//! copy of every row's head, block sums and heavy-token count ([`Layout`]),
//! then each row's planner on the host, then one gather (`gather_rows` over
//! 64-logit blocks, [`BlockCopy`]) and one copy for every row whose plan
//! asks for a block; a row whose plan asks for the whole row copies it. Each
//! row's arithmetic is the one-row readout's, so the draws and logprobs are
//! those of [`GpuModel::weighted_at`] (which is the one-row case: no upload,
//! no gather, the batch-1 launches and copies).

use super::readout::{HEAD_WORDS, TOP_KEYS, TOP_PER_PART, check_head, head_of};
use super::{F, GpuModel, Scratch};
use crate::gpu::kernels::{self, Launch};
use crate::gpu::{dptr, i};
use crate::readout::mask::TokenMask;
use crate::sampling::{RowPlanner, RowRead, RowSums, WEIGHT_BLOCK, WeightedRow, Weighting};
use anyhow::{Result, bail};

/// Threads per launch block of `logits_weights` (one per 64 logits).
const WEIGHT_THREADS: usize = 256;
/// Lanes a heavy-token count covers (`WARP` of kernels/compat.h).
const WARP: usize = 32;

/// One row of a weighted readout: its row of the logits buffer, how it is
/// weighted, its planner, and its mask (constrained decoding; the mask
/// table's entry of the same row holds it on the device).
pub(super) struct WeightedReq<'r, 'p> {
    pub row: usize,
    pub w: Weighting,
    pub plan: &'r mut RowPlanner<'p>,
    pub mask: Option<&'r TokenMask>,
}

/// Where a readout of `rows` rows finds its results in the words that come
/// back in one copy: every row's head (`HEAD_WORDS` words), then every row's
/// block sums (`nb` f64), then every row's heavy counts (`warps` u32, two to
/// a word). One row's layout is the batch-1 readout's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    rows: usize,
    /// Blocks of [`WEIGHT_BLOCK`] logits per row.
    nb: usize,
    /// `logits_weights` launch blocks per row, and their warps.
    grid: usize,
    warps: usize,
}

impl Layout {
    fn new(vocab: usize, rows: usize) -> Self {
        let nb = vocab.div_ceil(WEIGHT_BLOCK);
        let grid = nb.div_ceil(WEIGHT_THREADS);
        Layout {
            rows,
            nb,
            grid,
            warps: grid * WEIGHT_THREADS / WARP,
        }
    }

    /// Words of the copy.
    fn words(&self) -> usize {
        self.rows * (HEAD_WORDS + self.nb) + (self.rows * self.warps).div_ceil(2)
    }

    /// Word offsets of the block sums and of the heavy counts.
    fn blocks_at(&self) -> usize {
        self.rows * HEAD_WORDS
    }

    fn heavy_at(&self) -> usize {
        self.rows * (HEAD_WORDS + self.nb)
    }

    fn head<'w>(&self, all: &'w [u64], y: usize) -> &'w [u64] {
        &all[y * HEAD_WORDS..(y + 1) * HEAD_WORDS]
    }

    fn sums(&self, all: &[u64], y: usize) -> Vec<f64> {
        let at = self.blocks_at() + y * self.nb;
        all[at..at + self.nb]
            .iter()
            .map(|&b| f64::from_bits(b))
            .collect()
    }

    fn heavy(&self, all: &[u64], y: usize) -> usize {
        let words = &all[self.heavy_at()..];
        (y * self.warps..(y + 1) * self.warps)
            .map(|k| (words[k / 2] >> (32 * (k % 2))) as u32 as usize)
            .sum()
    }
}

/// The logits a read asks for, as (first token, count) of a row of `vocab`.
fn read_range(read: RowRead, vocab: usize) -> (usize, usize) {
    match read {
        RowRead::Head => (0, 0),
        RowRead::Block(b) => {
            let start = (b * WEIGHT_BLOCK).min(vocab);
            (start, WEIGHT_BLOCK.min(vocab - start))
        }
        RowRead::Whole => (0, vocab),
    }
}

/// One block gathered by `gather_rows` (`width` floats from float `src` of
/// the logits buffer, kept inside its `total` floats): the row's `len`
/// logits lie `shift` floats into it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BlockCopy {
    src: usize,
    shift: usize,
    len: usize,
}

/// Floats each gathered block copies out of a buffer of `total` floats.
fn gather_width(total: usize) -> usize {
    WEIGHT_BLOCK.min(total)
}

/// The copy of `len` logits from `start` of row `row` (rows of `vocab`) out
/// of a buffer of `total` floats: a block at the buffer's end starts early
/// enough that the gather reads nothing past it.
fn block_copy(row: usize, start: usize, len: usize, vocab: usize, total: usize) -> BlockCopy {
    let base = row * vocab + start;
    let src = base.min(total - gather_width(total));
    BlockCopy {
        src,
        shift: base - src,
        len,
    }
}

impl GpuModel {
    /// The readouts of `reqs` (heads checked here too), each over its row of
    /// the `buffer_rows` logits rows at `logits`, constrained rows under the
    /// mask table `table` (one entry per row of the buffer, 0: none; see
    /// [`GpuModel::upload_masks`]); the results in order. Each row's planner
    /// is called once.
    pub(super) fn weighted_rows(
        &self,
        sc: &mut Scratch,
        logits: u64,
        buffer_rows: usize,
        table: u64,
        reqs: &mut [WeightedReq],
    ) -> Result<Vec<WeightedRow>> {
        let (d, n) = (&self.dev, self.cfg.vocab_size);
        let wn = reqs.len();
        if wn == 0 {
            return Ok(Vec::new());
        }
        for r in reqs.iter() {
            check_head(r.w.head)?;
            if r.row >= buffer_rows {
                bail!("a weighted read of row {} of {buffer_rows}", r.row);
            }
        }
        let lay = Layout::new(n, wn);
        let parts = n.div_ceil(TOP_PER_PART);
        let keys = sc.get(d, "wtd_top_parts", wn * parts * TOP_KEYS * 8)?;
        let ms = sc.get(d, "wtd_top_ms", wn * parts * 2 * F)?;
        let out = sc.get(d, "wtd_out", lay.words() * 8)?;
        // One row reads its own row with its settings as arguments (the
        // batch-1 launches); several read the rows and settings listed in
        // one upload.
        let (x, rows_d, params_d, masks, t, min_p) = if let [r] = &*reqs {
            let entry = if table == 0 {
                0
            } else {
                table + (r.row * 8) as u64
            };
            let x = logits + (r.row * n * F) as u64;
            (x, 0, 0, entry, r.w.temperature, r.w.min_p)
        } else {
            let mut host: Vec<u32> = reqs.iter().map(|r| r.row as u32).collect();
            for r in reqs.iter() {
                host.extend([r.w.temperature.to_bits(), r.w.min_p.to_bits()]);
            }
            let sel = sc.get(d, "wtd_rows", host.len() * 4)?;
            d.htod(sel, &host)?;
            (logits, sel, sel + (wn * 4) as u64, table, 0.0, 0.0)
        };
        kernels::logits_top_part(
            d,
            Launch::new((parts as u32, wn as u32, 1), (1024, 1, 1), 0),
            dptr(x),
            i(n),
            i(TOP_PER_PART),
            dptr(rows_d),
            dptr(masks),
            dptr(keys),
            dptr(ms),
        )?;
        kernels::logits_top_merge(
            d,
            Launch::new((wn as u32, 1, 1), (1024, 1, 1), 0),
            dptr(keys),
            dptr(ms),
            i(parts),
            dptr(out),
        )?;
        kernels::logits_weights(
            d,
            Launch::new(
                (lay.grid as u32, wn as u32, 1),
                (WEIGHT_THREADS as u32, 1, 1),
                0,
            ),
            dptr(x),
            i(n),
            dptr(rows_d),
            dptr(params_d),
            t,
            min_p,
            dptr(out),
            dptr(masks),
            dptr(out + (lay.blocks_at() * 8) as u64),
            dptr(out + (lay.heavy_at() * 8) as u64),
        )?;
        let mut all = vec![0u64; lay.words()];
        d.dtoh(&mut all, out)?;
        // Each row's plan, from its head and sums.
        let mut rows = Vec::with_capacity(wn);
        for (y, r) in reqs.iter_mut().enumerate() {
            let head = head_of(lay.head(&all, y), r.w.head.min(n));
            let sums = lay.sums(&all, y);
            let heavy = lay.heavy(&all, y);
            let read = (r.plan)(
                &head,
                RowSums {
                    blocks: &sums,
                    heavy,
                },
            );
            let len = read_range(read, n).1;
            rows.push(WeightedRow {
                head,
                read,
                logits: vec![0f32; len],
            });
        }
        self.read_planned(sc, logits, buffer_rows, reqs, &mut rows)?;
        Ok(rows)
    }

    /// The logits each of `rows`' plans asks for, copied in and masked:
    /// every block in one gather and one copy (one block: a plain copy),
    /// each whole row on its own.
    fn read_planned(
        &self,
        sc: &mut Scratch,
        logits: u64,
        buffer_rows: usize,
        reqs: &[WeightedReq],
        rows: &mut [WeightedRow],
    ) -> Result<()> {
        let (d, n) = (&self.dev, self.cfg.vocab_size);
        let total = buffer_rows * n;
        let blocks: Vec<usize> = (0..rows.len())
            .filter(|&y| matches!(rows[y].read, RowRead::Block(_)) && !rows[y].logits.is_empty())
            .collect();
        let gathered = blocks.len() >= 2;
        if gathered {
            let width = gather_width(total);
            let copies: Vec<BlockCopy> = blocks
                .iter()
                .map(|&y| {
                    let (start, len) = read_range(rows[y].read, n);
                    block_copy(reqs[y].row, start, len, n, total)
                })
                .collect();
            let src: Vec<i32> = copies
                .iter()
                .map(|c| i32::try_from(c.src))
                .collect::<Result<_, _>>()?;
            let src_d = sc.get(d, "wtd_gather_src", src.len() * 4)?;
            d.htod(src_d, &src)?;
            let dst = sc.get(d, "wtd_gather", copies.len() * width * F)?;
            kernels::gather_rows(
                d,
                Launch::new((1, copies.len() as u32, 1), (WEIGHT_BLOCK as u32, 1, 1), 0),
                dptr(logits),
                i(1),
                dptr(src_d),
                i(copies.len()),
                i(width),
                dptr(dst),
            )?;
            let mut got = vec![0f32; copies.len() * width];
            d.dtoh(&mut got, dst)?;
            for (k, (c, &y)) in copies.iter().zip(&blocks).enumerate() {
                let at = k * width + c.shift;
                rows[y].logits.copy_from_slice(&got[at..at + c.len]);
            }
        }
        for (y, (row, r)) in rows.iter_mut().zip(reqs).enumerate() {
            let start = read_range(row.read, n).0;
            if !(gathered && blocks.contains(&y)) {
                let at = logits + ((r.row * n + start) * F) as u64;
                d.dtoh(&mut row.logits, at)?;
            }
            if let Some(m) = r.mask {
                m.apply(&mut row.logits, start);
            }
        }
        Ok(())
    }
}

/// A row of [`GpuModel::weighted_readout`]: the logits row it reads, its
/// weighting and mask, and what its plan asks for besides the head.
pub struct ReadoutCase {
    pub row: usize,
    pub w: Weighting,
    pub mask: Option<TokenMask>,
    pub read: RowRead,
}

/// What a [`ReadoutCase`]'s plan was handed (block sums, heavy count) and
/// what came back.
pub struct ReadoutGot {
    pub row: WeightedRow,
    pub blocks: Vec<f64>,
    pub heavy: usize,
}

impl GpuModel {
    /// `logits` (rows of the vocabulary) uploaded and read as `cases` ask:
    /// all in one [`GpuModel::weighted_rows`] (`together`), as a batched
    /// step reads its weighted rows, or each alone, as the batch-1 readout
    /// does. The way in for `qwasi verify`.
    pub fn weighted_readout(
        &self,
        logits: &[f32],
        cases: &[ReadoutCase],
        together: bool,
    ) -> Result<Vec<ReadoutGot>> {
        let n = self.cfg.vocab_size;
        if !logits.len().is_multiple_of(n) || logits.is_empty() {
            bail!("{} logits are no whole rows of {n}", logits.len());
        }
        let buffer_rows = logits.len() / n;
        let mut sc = self.scratch.lock().unwrap();
        self.dev.bind()?;
        let buf = sc.get(&self.dev, "wtd_check_logits", logits.len() * F)?;
        self.dev.htod(buf, logits)?;
        let mut row_masks: Vec<Option<&TokenMask>> = vec![None; buffer_rows];
        for c in cases {
            if c.row >= buffer_rows {
                bail!("a case reads row {} of {buffer_rows}", c.row);
            }
            row_masks[c.row] = c.mask.as_ref();
        }
        let table = self.upload_masks(&mut sc, &row_masks)?;
        let mut seen: Vec<(Vec<f64>, usize)> = vec![(Vec::new(), 0); cases.len()];
        let mut plans: Vec<Box<RowPlanner>> = seen
            .iter_mut()
            .zip(cases)
            .map(|(s, c)| {
                let read = c.read;
                Box::new(move |_: &_, sums: RowSums| {
                    *s = (sums.blocks.to_vec(), sums.heavy);
                    read
                }) as Box<RowPlanner>
            })
            .collect();
        let mut reqs: Vec<WeightedReq> = plans
            .iter_mut()
            .zip(cases)
            .map(|(p, c)| WeightedReq {
                row: c.row,
                w: c.w,
                plan: &mut **p,
                mask: c.mask.as_ref(),
            })
            .collect();
        let rows = if together {
            self.weighted_rows(&mut sc, buf, buffer_rows, table, &mut reqs)?
        } else {
            let mut rows = Vec::with_capacity(reqs.len());
            for k in 0..reqs.len() {
                let one = &mut reqs[k..k + 1];
                rows.extend(self.weighted_rows(&mut sc, buf, buffer_rows, table, one)?);
            }
            rows
        };
        drop(reqs);
        drop(plans);
        Ok(rows
            .into_iter()
            .zip(seen)
            .map(|(row, (blocks, heavy))| ReadoutGot { row, blocks, heavy })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row's results lie where the batch-1 readout always had them
    /// (head, block sums, heavy counts); several rows' one after another,
    /// each row's heavy counts packed two to a word across the rows.
    #[test]
    fn the_readback_layout_packs_every_rows_results() {
        let vocab = 248_320; // Qwen3.6: 3,880 blocks, 16 launch blocks
        let one = Layout::new(vocab, 1);
        assert_eq!((one.nb, one.grid, one.warps), (3880, 16, 128));
        assert_eq!(one.blocks_at(), HEAD_WORDS);
        assert_eq!(one.heavy_at(), HEAD_WORDS + 3880);
        assert_eq!(one.words(), HEAD_WORDS + 3880 + 64);
        // A row's warps odd in number: a row's counts start mid-word.
        let lay = Layout {
            rows: 3,
            nb: 2,
            grid: 1,
            warps: 3,
        };
        assert_eq!(lay.words(), 3 * (HEAD_WORDS + 2) + 5);
        let mut all = vec![0u64; lay.words()];
        for y in 0..3 {
            all[y * HEAD_WORDS] = 100 + y as u64;
            for b in 0..2 {
                all[lay.blocks_at() + 2 * y + b] = (y as f64 + b as f64 / 4.0).to_bits();
            }
        }
        // The u32 counts 1..=9 in order (kernel: heavy + y * warps).
        let counts: Vec<u32> = (1..=9).collect();
        for (k, &c) in counts.iter().enumerate() {
            all[lay.heavy_at() + k / 2] |= (c as u64) << (32 * (k % 2));
        }
        for y in 0..3 {
            assert_eq!(lay.head(&all, y)[0], 100 + y as u64);
            assert_eq!(lay.sums(&all, y), vec![y as f64, y as f64 + 0.25]);
            let want: u32 = counts[3 * y..3 * y + 3].iter().sum();
            assert_eq!(lay.heavy(&all, y), want as usize, "row {y}");
        }
    }

    /// The logits a read asks for: none, one block (the last one short),
    /// the whole row; a block past the row reads nothing.
    #[test]
    fn a_read_asks_for_its_block_or_row() {
        assert_eq!(read_range(RowRead::Head, 1000), (0, 0));
        assert_eq!(read_range(RowRead::Block(2), 1000), (128, 64));
        assert_eq!(read_range(RowRead::Block(15), 1000), (960, 40));
        assert_eq!(read_range(RowRead::Block(16), 1000), (1000, 0));
        assert_eq!(read_range(RowRead::Whole, 1000), (0, 1000));
    }

    /// The gather's source of each block is its place in the buffer, moved
    /// back at the buffer's end so that the 64 floats read stay inside it;
    /// the row's logits are then `shift` into what came back.
    #[test]
    fn gathered_blocks_stay_inside_the_buffer() {
        let (vocab, rows) = (1000, 3);
        let total = rows * vocab;
        // Row 1, block 2: in place.
        let c = block_copy(1, 128, 64, vocab, total);
        assert_eq!(
            c,
            BlockCopy {
                src: 1128,
                shift: 0,
                len: 64
            }
        );
        // Row 1's short last block reads into row 2: harmless.
        let c = block_copy(1, 960, 40, vocab, total);
        assert_eq!(
            c,
            BlockCopy {
                src: 1960,
                shift: 0,
                len: 40
            }
        );
        // The last row's short last block would read past the buffer.
        let c = block_copy(2, 960, 40, vocab, total);
        assert_eq!(
            c,
            BlockCopy {
                src: total - 64,
                shift: 24,
                len: 40
            }
        );
        assert!(c.src + gather_width(total) <= total);
        assert_eq!(c.src + c.shift, 2 * vocab + 960);
        // A buffer smaller than a block: the gather reads it all.
        let c = block_copy(1, 0, 20, 20, 40);
        assert_eq!(
            (gather_width(40), c),
            (
                40,
                BlockCopy {
                    src: 0,
                    shift: 20,
                    len: 20
                }
            )
        );
        // Every block of every row: inside, and at its logits.
        for row in 0..rows {
            for b in 0..vocab.div_ceil(WEIGHT_BLOCK) {
                let (start, len) = read_range(RowRead::Block(b), vocab);
                let c = block_copy(row, start, len, vocab, total);
                assert!(c.src + gather_width(total) <= total);
                assert!(c.shift + c.len <= gather_width(total));
                assert_eq!(c.src + c.shift, row * vocab + start);
            }
        }
    }
}
