//! Times each default rule's regex over a corpus file, to find the ones that cost
//! throughput. `cargo run --release -p crossguard-firewall --example profile_rules -- FILE.jsonl`
use std::time::Instant;

fn main() {
    let path = std::env::args().nth(1).unwrap_or_default();
    let text: String = std::fs::read_to_string(&path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("text").and_then(|t| t.as_str()).map(str::to_string))
        .collect::<Vec<_>>()
        .join("\n\n");
    let Ok(rules) = firewall::Ruleset::builtin() else { return };
    let t = Instant::now();
    let n = rules.scan(&text).len();
    println!("{} bytes, whole scan {:?}, {n} findings", text.len(), t.elapsed());
    let mut times: Vec<(std::time::Duration, usize, String)> = rules
        .rules()
        .iter()
        .map(|r| {
            let t = Instant::now();
            let c = r.regex.get().map_or(0, |re| re.find_iter(&text).count());
            (t.elapsed(), c, r.id.clone())
        })
        .collect();
    times.sort();
    times.reverse();
    for (d, c, id) in times.iter().take(15) {
        println!("{d:>12?} {c:>6} {id}");
    }
}
