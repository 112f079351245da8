//! Runs the cluster simulation over many seeds and fails on the first seed whose run breaks
//! the delivery contract, naming it so it can be replayed exactly:
//!
//! ```text
//! NARAD_SIM_SEEDS=5000 cargo nextest run -p narad-sim      # more seeds (default 2000)
//! NARAD_SIM_SEED=1234 cargo nextest run -p narad-sim       # one seed, replayed
//! NARAD_SIM_FIRST=100000 ...                               # another range of seeds
//! ```

use std::time::Instant;

use narad_sim::{SimConfig, run};

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {v:?}"))
    })
}

#[test]
fn every_seed_keeps_the_delivery_contract() {
    let seeds: Vec<u64> = match env("NARAD_SIM_SEED") {
        Some(one) => vec![one],
        None => {
            let first = env("NARAD_SIM_FIRST").unwrap_or(0);
            (first..first + env("NARAD_SIM_SEEDS").unwrap_or(2_000)).collect()
        }
    };
    let started = Instant::now();
    let mut total = narad_sim::Stats::default();
    for &seed in &seeds {
        let out = run(seed, SimConfig::default());
        assert!(
            out.is_clean(),
            "seed {seed} broke the contract (replay: NARAD_SIM_SEED={seed} cargo nextest run -p narad-sim)\n{}\nrenamed offsets: {:?}\nstats: {:?}",
            out.report,
            out.renamed,
            out.stats
        );
        let s = out.stats;
        total.moves_asked += s.moves_asked;
        total.moves_done += s.moves_done;
        total.moves_planned += s.moves_planned;
        total.drains += s.drains;
        total.attempts_failed += s.attempts_failed;
        total.flips_unknown += s.flips_unknown;
        total.thaws += s.thaws;
        total.kills += s.kills;
        total.stops += s.stops;
        total.cuts += s.cuts;
        total.elections += s.elections;
        total.produced += s.produced;
        total.accepted += s.accepted;
        total.delivered += s.delivered;
        total.acked += s.acked;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{} seeds in {secs:.1} s ({:.0} seeds a minute): {total:?}",
        seeds.len(),
        seeds.len() as f64 * 60.0 / secs
    );
    // a run that exercised nothing would pass trivially
    if seeds.len() >= 100 {
        assert!(total.moves_done > seeds.len() as u64 / 2, "{total:?}");
        assert!(
            total.flips_unknown > 0 && total.thaws > 0 && total.kills > 0,
            "{total:?}"
        );
    }
}

#[test]
fn a_seed_replays_exactly() {
    for seed in [7, 4242] {
        let a = run(seed, SimConfig::default());
        let b = run(seed, SimConfig::default());
        assert_eq!(a.trace, b.trace, "seed {seed}");
        assert_eq!(a.stats, b.stats, "seed {seed}");
    }
    assert_ne!(
        run(1, SimConfig::default()).trace,
        run(2, SimConfig::default()).trace
    );
}
