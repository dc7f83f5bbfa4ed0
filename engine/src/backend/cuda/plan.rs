//! The host-side plan of one GPU step: the batch's rows, sequences, block tables and owner
//! tags packed into the one upload the kernels read (`Plan::meta`, with `Layout` naming its
//! ranges), the greedy picks to make, and what the step gives back (`StepOut`).
//!
//! It is built on the host from the KV pool alone, so it is unit-tested without a GPU;
//! `forward.rs` uploads and runs it, `workspace.rs` sizes the device buffers for it.

use super::kv::TenantTags;
use super::launch::SEQ_FIELDS;
use crate::kv::{KvPool, Tenant};
use crate::model::Segment;
use crate::sample::{GreedyRow, RowNeed};

/// The attention workspace's row length is a multiple of this, so that a decode step's
/// arguments (and its CUDA graph) stay the same for this many positions.
const VISIBLE_BUCKET: usize = 128;

/// Ranges of the step upload (`Plan::meta`) each kernel argument views.
#[derive(Debug, Default)]
pub(super) struct Layout {
    /// `[rows]` token ids
    pub(super) ids: std::ops::Range<usize>,
    /// `[rows]` sequence (index among live ones) of each row
    pub(super) row_seq: std::ops::Range<usize>,
    /// `[rows]` absolute position of each row
    pub(super) row_pos: std::ops::Range<usize>,
    /// `[live]` row of each sequence's last token
    pub(super) last: std::ops::Range<usize>,
    /// `[live, SEQ_FIELDS]`
    pub(super) seqs: std::ops::Range<usize>,
    /// `[Σ blocks]` block tables back to back
    pub(super) tables: std::ops::Range<usize>,
}

/// One step as the host describes it to the kernels.
#[derive(Debug)]
pub(super) struct Plan {
    pub(super) meta: Vec<u32>,
    pub(super) at: Layout,
    /// `[total_blocks]` owner tags of the blocks this step touches (0 elsewhere)
    pub(super) tags: Vec<u32>,
    pub(super) rows: usize,
    pub(super) max_visible: usize,
    /// `[live]` positions each sequence has written after this step
    pub(super) readable: Vec<usize>,
    /// `[live]` tenants owning the blocks each sequence's attention reads
    pub(super) owners: Vec<Vec<Tenant>>,
    pub(super) skip_owner_check: bool,
    pub(super) skip_bounds_check: bool,
    /// `[live]` what each sequence's caller needs of its last row
    pub(super) needs: Vec<RowNeed>,
    /// The greedy picks to make, when any sequence needs one.
    pub(super) greedy: Option<GreedyPlan>,
}

/// The greedy picks of a step: every live row's adjustments, back to back.
#[derive(Debug, Default)]
pub(super) struct GreedyPlan {
    /// `[live + 1]` row `k` owns entries `spans[k]..spans[k + 1]`
    pub(super) spans: Vec<u32>,
    /// Each row's adjusted ids, sorted, equal ids in the order they are added.
    pub(super) ids: Vec<u32>,
    pub(super) deltas: Vec<f32>,
    /// The most top logprobs a row asks for.
    pub(super) top_k: usize,
}

impl GreedyPlan {
    fn build(needs: &[RowNeed]) -> Option<GreedyPlan> {
        if !needs.iter().any(|n| matches!(n, RowNeed::Greedy { .. })) {
            return None;
        }
        let mut g = GreedyPlan { spans: vec![0], ..GreedyPlan::default() };
        for need in needs {
            if let RowNeed::Greedy { top_n, adjust } = need {
                let mut adjust = adjust.clone();
                // Stable: a repeated id keeps the order its deltas are added in.
                adjust.sort_by_key(|a| a.0);
                g.ids.extend(adjust.iter().map(|a| a.0));
                g.deltas.extend(adjust.iter().map(|a| a.1));
                g.top_k = g.top_k.max(*top_n);
            }
            g.spans.push(g.ids.len() as u32);
        }
        Some(g)
    }
}

/// What a step gives back, per live sequence.
pub(super) struct StepOut {
    /// `[live, 3]` isolation status words
    pub(super) status: Vec<u32>,
    /// The last row's logits, for sequences that need them.
    pub(super) rows: Vec<Option<Vec<f32>>>,
    /// The greedy pick, for sequences that asked for one.
    pub(super) picks: Vec<Option<GreedyRow>>,
}

impl Plan {
    pub(super) fn build(tenants: &TenantTags, pool: &KvPool, segments: &[Segment<'_, '_>], live: &[usize]) -> Plan {
        let bt = pool.shape().block_tokens;
        let (mut ids, mut row_seq, mut row_pos, mut last, mut seqs, mut tables) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut tags = vec![0u32; pool.total_blocks()];
        let (mut readable, mut owners, mut needs) = (Vec::new(), Vec::new(), Vec::new());
        for (k, &i) in live.iter().enumerate() {
            let seg = &segments[i];
            needs.push(seg.need.clone());
            let start = seg.kv.len();
            let end = start + seg.tokens.len();
            ids.extend_from_slice(seg.tokens);
            row_seq.extend(std::iter::repeat_n(k as u32, seg.tokens.len()));
            row_pos.extend((start..end).map(|p| p as u32));
            last.push((row_pos.len() - 1) as u32);
            let table = seg.kv.blocks();
            seqs.extend_from_slice(&[
                tables.len() as u32,
                table.len() as u32,
                tenants.tag(&seg.kv.owner().tenant),
                start as u32,
                end as u32,
            ]);
            tables.extend(table.iter().map(|&b| b as u32));
            // Whose blocks attention reads: those covering positions 0..end.
            let mut read = Vec::new();
            for &b in table.iter().take(end.div_ceil(bt)) {
                if let Some(tenant) = pool.try_read(b).and_then(|blk| blk.owner.as_ref().map(|o| o.tenant.clone())) {
                    if let Some(t) = tags.get_mut(b) {
                        *t = tenants.tag(&tenant);
                    }
                    read.push(tenant);
                }
            }
            readable.push(end);
            owners.push(read);
        }
        let mut meta = Vec::with_capacity(3 * ids.len() + last.len() + seqs.len() + tables.len());
        let mut put = |part: &[u32]| {
            let at = meta.len()..meta.len() + part.len();
            meta.extend_from_slice(part);
            at
        };
        let at = Layout {
            ids: put(&ids),
            row_seq: put(&row_seq),
            row_pos: put(&row_pos),
            last: put(&last),
            seqs: put(&seqs),
            tables: put(&tables),
        };
        debug_assert_eq!(seqs.len(), live.len() * SEQ_FIELDS);
        let fault = pool.fault();
        let greedy = GreedyPlan::build(&needs);
        Plan {
            meta,
            at,
            tags,
            rows: ids.len(),
            max_visible: readable.iter().copied().max().unwrap_or(0).next_multiple_of(VISIBLE_BUCKET),
            readable,
            owners,
            skip_owner_check: fault.skip_owner_check,
            skip_bounds_check: fault.skip_bounds_check,
            needs,
            greedy,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::FaultConfig;
    use crate::kv::{BlockShape, Owner, SequenceKv};

    fn pool() -> KvPool {
        let shape = BlockShape { layers: 2, block_tokens: 4, kv_dim: 8, kv_heads: 2 };
        KvPool::new(shape, 16, FaultConfig::default()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_plan_describes_each_live_sequence_its_rows_and_the_owner_tags_of_its_blocks() {
        let pool = pool();
        let tenants = TenantTags::default();
        let (mut a, mut b) = (
            SequenceKv::uncached(&pool, Owner::new("alice", "1"), 32),
            SequenceKv::uncached(&pool, Owner::new("bob", "2"), 32),
        );
        // alice: 5 tokens already written, 1 new (decode); bob: 6 new (prefill).
        a.reserve(&[1, 2, 3, 4, 5]).unwrap_or_else(|e| panic!("{e}"));
        a.commit();
        let (ta, tb) = ([6u32], [7u32, 8, 9, 10, 11, 12]);
        let mut segments = [Segment::new(&ta, &mut a), Segment::new(&tb, &mut b)];
        for seg in segments.iter_mut() {
            seg.kv.reserve(seg.tokens).unwrap_or_else(|e| panic!("{e}"));
        }
        let plan = Plan::build(&tenants, &pool, &segments, &[0, 1]);
        let part = |r: &std::ops::Range<usize>| plan.meta[r.clone()].to_vec();
        assert_eq!(plan.rows, 7);
        assert_eq!(part(&plan.at.ids), [6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(part(&plan.at.row_seq), [0, 1, 1, 1, 1, 1, 1]);
        assert_eq!(part(&plan.at.row_pos), [5, 0, 1, 2, 3, 4, 5]);
        assert_eq!(part(&plan.at.last), [0, 6]);
        let (alice, bob) = (tenants.tag(&"alice".into()), tenants.tag(&"bob".into()));
        assert_ne!(alice, bob);
        // [table_at, table_len, tenant, write_from, readable] per sequence.
        assert_eq!(part(&plan.at.seqs), [0, 2, alice, 5, 6, 2, 2, bob, 0, 6]);
        let tables = part(&plan.at.tables);
        assert_eq!(tables.len(), 4);
        for (i, &id) in tables.iter().enumerate() {
            assert_eq!(plan.tags[id as usize], if i < 2 { alice } else { bob }, "block {id}");
        }
        assert_eq!(plan.tags.iter().filter(|t| **t != 0).count(), 4, "untouched blocks carry no tag");
        assert_eq!((plan.max_visible, plan.readable.clone()), (VISIBLE_BUCKET, vec![5 + 1, 6]));
        let names = |k: usize| plan.owners[k].iter().map(|t| t.as_str().to_owned()).collect::<Vec<_>>();
        assert_eq!((names(0), names(1)), (vec!["alice".to_owned(); 2], vec!["bob".to_owned(); 2]));
    }
}
