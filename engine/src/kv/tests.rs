//! Isolation and accounting tests of the KV pool, without a model: rows are written with
//! recognisable values and read back through the same views attention uses. Each defence
//! has a test that it holds and a test that its fault switch defeats it.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::error::{Error, Result};
use crate::fault::FaultConfig;

const SHAPE: BlockShape = BlockShape { layers: 2, block_tokens: 4, kv_dim: 3, kv_heads: 1 };

fn pool(blocks: usize, fault: FaultConfig) -> Result<KvPool> {
    KvPool::new(SHAPE, blocks, fault)
}

fn faults(f: impl FnOnce(&mut FaultConfig)) -> FaultConfig {
    let mut fault = FaultConfig::default();
    f(&mut fault);
    fault
}

/// One forward step without a model: every layer's rows of `tokens` hold `value`, then
/// each layer is read through a checked view, then the step is committed.
fn step(seq: &mut SequenceKv<'_>, tokens: &[u32], value: f32) -> Result<()> {
    let start = seq.len();
    seq.reserve(tokens)?;
    let row = [value; 3];
    for layer in 0..SHAPE.layers {
        for pos in start..start + tokens.len() {
            seq.write(layer, pos, &row, &row)?;
        }
        seq.layer(layer, start + tokens.len())?;
    }
    seq.commit();
    Ok(())
}

/// The value of position `pos`'s key row in layer 0, read through a checked view.
fn key_at(seq: &mut SequenceKv<'_>, pos: usize, readable: usize) -> Result<Vec<f32>> {
    Ok(seq.layer(0, readable)?.key(pos))
}

fn is_isolation(r: &Result<impl Sized>) -> bool {
    matches!(r, Err(Error::Isolation { .. }))
}

#[test]
fn released_blocks_read_back_zeros() -> Result<()> {
    let pool = pool(1, FaultConfig::default())?;
    let mut a = SequenceKv::new(&pool, Owner::new("a", "1"), 64);
    step(&mut a, &[1, 2, 3], 7.0)?;
    assert_eq!(key_at(&mut a, 2, 3)?, [7.0; 3]);
    drop(a);
    // The only block is reused; what the new owner can read of it is zeros.
    let mut b = SequenceKv::new(&pool, Owner::new("b", "2"), 64);
    step(&mut b, &[9], 1.0)?;
    assert_eq!(b.blocks(), [0]);
    let view = b.layer(0, 1)?;
    assert_eq!(view.key(0), [1.0; 3]);
    drop(view);
    let block = pool.read(0);
    assert!(
        block.contents().iter().map(|v| v.to_f32()).filter(|v| *v != 1.0).all(|v| v == 0.0),
        "old rows were cleared"
    );
    assert!(pool.stats().zero_fills >= 1);
    Ok(())
}

#[test]
fn skip_zero_fill_leaves_the_old_rows_in_a_reused_block() -> Result<()> {
    let pool = pool(1, faults(|f| f.skip_zero_fill = true))?;
    let mut a = SequenceKv::new(&pool, Owner::new("a", "1"), 64);
    step(&mut a, &[1, 2, 3], 7.0)?;
    drop(a);
    let mut b = SequenceKv::new(&pool, Owner::new("b", "2"), 64);
    step(&mut b, &[9], 1.0)?;
    // Keys are stored transposed: position 1 of dimension 0 is the block's second value.
    assert_eq!(pool.read(0).contents()[1].to_f32(), 7.0, "a's row 1 survived the release");
    assert_eq!(pool.stats().zero_fills, 0);
    Ok(())
}

/// Tenant `a` writes a block and finishes; tenant `b` starts under `stale_kv = 1`.
fn stale_handout(pool: &KvPool) -> Result<SequenceKv<'_>> {
    let mut a = SequenceKv::new(pool, Owner::new("a", "1"), 64);
    // A partial block: not offered to the prefix cache, so released at once.
    step(&mut a, &[1, 2, 3], 7.0)?;
    drop(a);
    let b = SequenceKv::for_prompt(pool, Owner::new("b", "2"), 64, &[5, 6]);
    assert_eq!((b.len(), b.cached_prompt_tokens()), (SHAPE.block_tokens, 0), "b starts with a's block as context");
    Ok(b)
}

#[test]
fn a_foreign_block_in_the_table_is_refused_and_counted() -> Result<()> {
    let pool = pool(4, faults(|f| f.stale_kv = 1.0))?;
    let mut b = stale_handout(&pool)?;
    let refused = step(&mut b, &[5, 6], 1.0);
    assert!(is_isolation(&refused), "{refused:?}");
    assert!(is_isolation(&b.layer(0, 1)));
    let stats = pool.stats();
    assert_eq!((stats.stale_handouts, stats.isolation_violations), (1, 2));
    drop(b);
    pool.audit().map_err(|reason| Error::InvalidRequest { reason })?;
    Ok(())
}

#[test]
fn skip_owner_check_reads_the_foreign_block_and_provenance_names_its_tenant() -> Result<()> {
    let pool = pool(
        4,
        faults(|f| {
            f.stale_kv = 1.0;
            f.skip_owner_check = true;
        }),
    )?;
    let mut b = stale_handout(&pool)?;
    step(&mut b, &[5, 6], 1.0)?;
    assert_eq!(key_at(&mut b, 1, 6)?, [7.0; 3], "a's key row, read by b");
    let owners: Vec<&str> = b.read_owners().iter().map(Tenant::as_str).collect();
    assert_eq!(owners, ["a", "b"]);
    Ok(())
}

#[test]
fn reads_past_the_written_length_or_the_table_are_refused() -> Result<()> {
    let pool = pool(4, FaultConfig::default())?;
    let mut b = SequenceKv::new(&pool, Owner::new("b", "1"), 64);
    step(&mut b, &[1, 2], 1.0)?;
    assert!(is_isolation(&b.layer(0, 3)), "inside the block, past the length");
    assert!(is_isolation(&b.layer(0, 9)), "past the table");
    assert!(is_isolation(&b.write(0, 5, &[0.0; 3], &[0.0; 3])), "a write outside the reserved positions");
    assert_eq!(pool.stats().isolation_violations, 3);
    Ok(())
}

#[test]
fn skip_bounds_check_reads_past_the_length_and_past_the_table() -> Result<()> {
    let pool = pool(
        4,
        faults(|f| {
            f.skip_bounds_check = true;
            f.skip_owner_check = true;
        }),
    )?;
    // b gets block 0, a the physically next block 1.
    let mut b = SequenceKv::new(&pool, Owner::new("b", "1"), 64);
    step(&mut b, &[1, 2], 1.0)?;
    let mut a = SequenceKv::new(&pool, Owner::new("a", "2"), 64);
    step(&mut a, &[3, 4, 5], 7.0)?;
    assert_eq!(key_at(&mut b, 2, 3)?.len(), SHAPE.kv_dim, "a row past the length");
    assert_eq!(key_at(&mut b, SHAPE.block_tokens, SHAPE.block_tokens + 1)?, [7.0; 3], "a's row, past b's table");
    assert!(b.read_owners().iter().any(|t| t.as_str() == "a"));
    Ok(())
}

#[test]
fn skip_bounds_check_alone_is_still_stopped_by_the_owner_check() -> Result<()> {
    let pool = pool(4, faults(|f| f.skip_bounds_check = true))?;
    let mut b = SequenceKv::new(&pool, Owner::new("b", "1"), 64);
    step(&mut b, &[1, 2], 1.0)?;
    let mut a = SequenceKv::new(&pool, Owner::new("a", "2"), 64);
    step(&mut a, &[3], 7.0)?;
    assert!(is_isolation(&b.layer(0, SHAPE.block_tokens + 1)));
    Ok(())
}

/// Runs `prompt` to completion for `owner` and returns the block table (sequence kept).
fn prefilled<'p>(pool: &'p KvPool, owner: Owner, prompt: &[u32]) -> Result<SequenceKv<'p>> {
    let mut seq = SequenceKv::for_prompt(pool, owner, 64, prompt);
    let rest = prompt[seq.cached_prompt_tokens()..].to_vec();
    step(&mut seq, &rest, 1.0)?;
    Ok(seq)
}

const PROMPT: [u32; 10] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];

#[test]
fn two_tenants_with_the_same_prompt_share_no_block() -> Result<()> {
    let pool = pool(16, FaultConfig::default())?;
    let a = prefilled(&pool, Owner::new("a", "1"), &PROMPT)?;
    let b = prefilled(&pool, Owner::new("b", "2"), &PROMPT)?;
    assert_eq!(b.cached_prompt_tokens(), 0);
    assert!(a.blocks().iter().all(|x| !b.blocks().contains(x)), "{:?} {:?}", a.blocks(), b.blocks());
    assert_eq!(pool.stats().prefix_hits, 0);
    Ok(())
}

#[test]
fn unsalted_prefix_cache_shares_blocks_across_tenants() -> Result<()> {
    let pool = pool(16, faults(|f| f.unsalted_prefix_cache = true))?;
    let a = prefilled(&pool, Owner::new("a", "1"), &PROMPT)?;
    let b = SequenceKv::for_prompt(&pool, Owner::new("b", "2"), 64, &PROMPT);
    assert_eq!(b.cached_prompt_tokens(), 8);
    assert_eq!(a.blocks()[..2], b.blocks()[..2]);
    Ok(())
}

#[test]
fn one_tenants_repeated_prefix_is_shared() -> Result<()> {
    let pool = pool(16, FaultConfig::default())?;
    let first = prefilled(&pool, Owner::new("a", "1"), &PROMPT)?;
    let again = prefilled(&pool, Owner::new("a", "2"), &PROMPT)?;
    assert_eq!(again.cached_prompt_tokens(), 8);
    assert_eq!(first.blocks()[..2], again.blocks()[..2]);
    assert_ne!(first.blocks()[2], again.blocks()[2], "the partial block is private");
    assert_eq!(pool.stats().prefix_hits, 2);
    Ok(())
}

#[test]
fn a_shared_block_is_copied_before_it_is_written() -> Result<()> {
    let pool = pool(16, FaultConfig::default())?;
    // Exactly two blocks: the second request must recompute the last token, inside the
    // second shared block.
    let prompt = &PROMPT[..8];
    let first = prefilled(&pool, Owner::new("a", "1"), prompt)?;
    let mut again = SequenceKv::for_prompt(&pool, Owner::new("a", "2"), 64, prompt);
    assert_eq!(again.cached_prompt_tokens(), 7);
    step(&mut again, &prompt[7..], 5.0)?;
    assert_eq!(first.blocks()[0], again.blocks()[0]);
    assert_ne!(first.blocks()[1], again.blocks()[1]);
    let mut first = first;
    assert_eq!(key_at(&mut first, 7, 8)?, [1.0; 3], "the shared original is untouched");
    assert_eq!(key_at(&mut again, 6, 8)?, [1.0; 3], "the copy kept the cached rows");
    assert_eq!(key_at(&mut again, 7, 8)?, [5.0; 3]);
    Ok(())
}

#[test]
fn block_size_must_be_a_power_of_two() {
    let odd = BlockShape { block_tokens: 12, ..SHAPE };
    assert!(matches!(KvPool::new(odd, 4, FaultConfig::default()), Err(Error::InvalidOptions { .. })));
}

/// 1,000 requests from 5 tenants over a small pool, several alive at once: prompts from a
/// tiny alphabet (so prefixes repeat), decode steps, aborts at random points, and pool
/// exhaustion. Afterwards every block is free or held by the prefix cache alone, free
/// blocks are zero and untagged, and free + used == total.
#[test]
fn accounting_is_exact_after_a_randomized_workload_with_aborts() -> Result<()> {
    let pool = pool(24, FaultConfig::default())?;
    let mut rng = StdRng::seed_from_u64(5);
    let mut live: Vec<(SequenceKv<'_>, usize)> = Vec::new();
    let (mut started, mut exhausted) = (0, 0);
    while started < 1000 || !live.is_empty() {
        if started < 1000 && (live.len() < 6 && rng.gen_bool(0.5)) {
            let tenant = format!("t{}", rng.gen_range(0..5));
            let prompt: Vec<u32> = (0..rng.gen_range(1..20)).map(|_| rng.gen_range(0..3)).collect();
            let mut seq = SequenceKv::for_prompt(&pool, Owner::new(&tenant, &started.to_string()), 64, &prompt);
            started += 1;
            let rest = prompt[seq.cached_prompt_tokens()..].to_vec();
            match step(&mut seq, &rest, 1.0) {
                Ok(()) => live.push((seq, rng.gen_range(0..12))),
                Err(Error::KvExhausted { .. }) => exhausted += 1,
                Err(e) => return Err(e),
            }
            continue;
        }
        let Some(i) = (!live.is_empty()).then(|| rng.gen_range(0..live.len())) else { continue };
        let (seq, left) = &mut live[i];
        let abort = rng.gen_bool(0.1);
        if *left == 0 || abort {
            live.swap_remove(i);
            continue;
        }
        *left -= 1;
        match step(seq, &[rng.gen_range(0..3)], 2.0) {
            Ok(()) => {}
            Err(Error::KvExhausted { .. }) => {
                exhausted += 1;
                live.swap_remove(i);
            }
            Err(e) => return Err(e),
        }
    }
    pool.audit().map_err(|reason| Error::InvalidRequest { reason })?;
    let stats = pool.stats();
    assert_eq!(stats.blocks_free + stats.blocks_used, stats.blocks_total);
    assert_eq!(stats.blocks_used, stats.blocks_cached, "only the prefix cache holds blocks");
    assert_eq!((stats.blocks_pending_zero, stats.isolation_violations), (0, 0));
    assert!(
        stats.prefix_hits > 0 && exhausted > 0,
        "the workload exercised sharing ({}) and exhaustion ({exhausted})",
        stats.prefix_hits
    );
    for id in 0..pool.total_blocks() {
        let block = pool.read(id);
        if block.owner.is_none() {
            assert!(block.contents().iter().all(|v| v.to_f32() == 0.0), "free block {id} is not zero");
        }
    }
    Ok(())
}

#[test]
fn rows_read_back_as_written_across_blocks_and_heads() -> Result<(), Box<dyn std::error::Error>> {
    let shape = BlockShape { kv_dim: 6, kv_heads: 2, ..SHAPE };
    let pool = KvPool::new(shape, 4, FaultConfig::default())?;
    let mut seq = SequenceKv::new(&pool, Owner::new("a", "1"), 64);
    let n = shape.block_tokens + 2;
    seq.reserve(&vec![1; n])?;
    let row = |pos: usize, base: f32| -> Vec<f32> { (0..shape.kv_dim).map(|d| base + (10 * pos + d) as f32).collect() };
    for pos in 0..n {
        seq.write(1, pos, &row(pos, 0.0), &row(pos, 0.5))?;
    }
    let view = seq.layer(1, n)?;
    for pos in 0..n {
        assert_eq!((view.key(pos), view.value(pos)), (row(pos, 0.0), row(pos, 0.5)), "position {pos}");
    }
    assert!(view.key(n).is_empty() && view.value(n).is_empty());
    // The second head (dimensions 3..6) of the partial second block: two positions served.
    let head = view.head_block(1, 1).ok_or("second block")?;
    let (bt, hd) = (shape.block_tokens, shape.head_dim());
    assert_eq!((head.positions, head.keys.len(), head.values.len()), (2, (hd - 1) * bt + 2, 2 * hd));
    assert_eq!(
        head.keys[bt + 1].to_f32(),
        row(bt + 1, 0.0)[hd + 1],
        "dimension 1 of the head at the block's position 1"
    );
    assert_eq!(head.values[hd + 2].to_f32(), row(bt + 1, 0.5)[hd + 2]);
    assert!(view.head_block(2, 0).is_none() && view.head_block(0, 2).is_none());
    Ok(())
}

/// Rows are rounded to f16 as `f16::from_f32` rounds each value (ties to even), whole
/// vectors at a time, also for heads longer than one conversion step.
#[test]
fn rows_are_stored_rounded_to_f16_like_each_value_alone() -> Result<(), Box<dyn std::error::Error>> {
    let shape = BlockShape { kv_dim: 2 * 160, kv_heads: 2, ..SHAPE };
    let pool = KvPool::new(shape, 2, FaultConfig::default())?;
    let mut seq = SequenceKv::new(&pool, Owner::new("a", "1"), 8);
    seq.reserve(&[1, 2, 3])?;
    // Exact ties between f16 neighbours (1 + 2^-11, 1 + 3 * 2^-11), values past f16's
    // range, subnormals, and plain fractions.
    let row = |pos: usize| -> Vec<f32> {
        (0..shape.kv_dim)
            .map(|d| match d % 5 {
                0 => 1.0 + (1 + 2 * (d % 3)) as f32 / 2048.0,
                1 => 7.0e4 * if d % 2 == 0 { 1.0 } else { -1.0 },
                2 => 3.0e-7 * d as f32,
                _ => (d as f32 * 0.731 + pos as f32).sin() * 13.0,
            })
            .collect()
    };
    let rounded = |v: Vec<f32>| -> Vec<f32> { v.into_iter().map(|x| half::f16::from_f32(x).to_f32()).collect() };
    for pos in 0..3 {
        seq.write(0, pos, &row(pos), &row(pos + 7))?;
    }
    let view = seq.layer(0, 3)?;
    for pos in 0..3 {
        assert_eq!(view.key(pos), rounded(row(pos)), "key at {pos}");
        assert_eq!(view.value(pos), rounded(row(pos + 7)), "value at {pos}");
    }
    Ok(())
}

/// The arena streams a sequence's blocks as one run per head only if they come in order:
/// a finished sequence's blocks go back so that the next one gets them ascending.
#[test]
fn a_new_sequence_reuses_released_blocks_in_ascending_order() -> Result<()> {
    let pool = pool(8, FaultConfig::default())?;
    let mut a = SequenceKv::uncached(&pool, Owner::new("a", "1"), 64);
    step(&mut a, &[1; 10], 1.0)?;
    assert_eq!(a.blocks(), [0, 1, 2]);
    drop(a);
    let mut b = SequenceKv::uncached(&pool, Owner::new("b", "2"), 64);
    step(&mut b, &[2; 14], 1.0)?;
    assert_eq!(b.blocks(), [0, 1, 2, 3]);
    Ok(())
}

/// 420 TB of blocks: the arena cannot be had, and the first block handed out says so
/// (rather than the process aborting).
#[test]
fn a_pool_too_large_for_memory_is_an_error_at_the_first_block() -> Result<()> {
    let huge = BlockShape { layers: 1000, block_tokens: 1024, kv_dim: 1024, kv_heads: 1 };
    let pool = KvPool::new(huge, 100_000, FaultConfig::default())?;
    let mut seq = SequenceKv::new(&pool, Owner::new("a", "1"), 64);
    assert!(matches!(seq.reserve(&[1]), Err(Error::InvalidOptions { .. })));
    Ok(())
}

#[test]
fn a_row_must_split_into_whole_heads() {
    let uneven = BlockShape { kv_dim: 6, kv_heads: 4, ..SHAPE };
    assert!(matches!(KvPool::new(uneven, 4, FaultConfig::default()), Err(Error::InvalidOptions { .. })));
}
