//! The upstream SSE parser on any bytes: no panic; the same events and the same error for
//! every chunking of the stream as for one push; every event's data is built from the
//! input's own bytes, so no event outgrows it. The fuzzer's `-malloc_limit_mb` (set small
//! by scripts/fuzz.sh) fails any single allocation far beyond the input: bounded memory.
//! With an event cap (`max_stream_event_bytes`), no event's data passes it, and the events
//! delivered are those of the uncapped parse up to the first one over it.
#![no_main]

use gateway::backend::sse::{SseError, SseEvent, SseParser};
use libfuzzer_sys::fuzz_target;

/// Events up to the first error, and that error.
fn parse(pieces: &mut dyn Iterator<Item = &[u8]>) -> (Vec<SseEvent>, Option<SseError>) {
    parse_with(SseParser::new(), pieces)
}

fn parse_with(mut parser: SseParser, pieces: &mut dyn Iterator<Item = &[u8]>) -> (Vec<SseEvent>, Option<SseError>) {
    let mut events = Vec::new();
    for piece in pieces {
        if let Err(e) = parser.push(piece, &mut events) {
            return (events, Some(e));
        }
    }
    let err = parser.finish(&mut events).err();
    (events, err)
}

/// Splits `bytes` into pieces of 1 to 16 bytes, lengths drawn from `seed` (a small LCG),
/// so boundaries fall inside `\r\n` pairs, field names and UTF-8 sequences.
fn pieces(bytes: &[u8], seed: u8) -> Vec<&[u8]> {
    let mut state = u32::from(seed) | 1;
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let len = ((state >> 24) as usize % 16 + 1).min(rest.len());
        let (piece, tail) = rest.split_at(len);
        out.push(piece);
        rest = tail;
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, stream)) = data.split_first() else { return };
    let whole = parse(&mut std::iter::once(stream));
    let chunked = parse(&mut pieces(stream, seed).into_iter());
    assert_eq!(chunked, whole, "chunking changed the events");
    let bytewise = parse(&mut stream.chunks(1));
    assert_eq!(bytewise, whole, "byte-by-byte feeding changed the events");

    let cap = 16 + usize::from(seed % 64);
    let (capped, _) = parse_with(SseParser::with_max_event_bytes(cap), &mut pieces(stream, seed).into_iter());
    assert!(capped.iter().all(|e| e.data.len() <= cap), "an event passed the cap");
    assert!(whole.0.starts_with(&capped), "the cap changed the events before it");

    let (events, _) = whole;
    let line_ends = stream.iter().filter(|&&b| b == b'\n' || b == b'\r').count();
    assert!(events.len() <= line_ends + 1, "more events than lines");
    for event in &events {
        assert!(event.data.len() <= stream.len(), "an event outgrew its input");
        assert!(!event.data.contains('\r'), "a line end leaked into event data");
    }
});
