fn main() -> anyhow::Result<()> {
    anyhow::bail!("bigfleet: not built yet")
}
