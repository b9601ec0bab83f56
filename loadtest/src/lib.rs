//! Load generators and the scale harness: simulated operators, gateway load, e2e bench.
