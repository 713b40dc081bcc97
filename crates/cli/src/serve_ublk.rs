//! `snapblk serve --ublk` options and runner (owned by the ublk export).

use clap::Args;

/// Options of the ublk export.
#[derive(Args, Debug, Default)]
pub struct UblkArgs {}

/// Serve `dev` as /dev/ublkbN until SIGINT/SIGTERM.
pub fn run(_dev: snapblk_core::Blkio, _args: &UblkArgs, _json: bool) -> anyhow::Result<()> {
    anyhow::bail!("ublk export not implemented yet")
}
