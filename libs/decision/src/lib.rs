//! The pure decision engine: snapshot, NormalizeDemand, Phase 1/2/3, verdicts, shortfall seeds.
