//! `tollgate-componentize IN OUT [IN OUT]...`: wraps each core module (built by wit-bindgen, so it
//! carries its component type in a custom section) into a component, validated, in-process.

use std::path::Path;

use anyhow::{bail, Context, Result};
use wit_component::ComponentEncoder;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || !args.len().is_multiple_of(2) {
        bail!("usage: tollgate-componentize IN.wasm OUT.wasm [IN.wasm OUT.wasm]...");
    }
    for pair in args.chunks(2) {
        componentize(Path::new(&pair[0]), Path::new(&pair[1]))?;
    }
    Ok(())
}

fn componentize(input: &Path, output: &Path) -> Result<()> {
    let module = std::fs::read(input).with_context(|| format!("reading {}", input.display()))?;
    let component = ComponentEncoder::default()
        .module(&module)
        .with_context(|| format!("{} is not a wit-bindgen core module", input.display()))?
        .validate(true)
        .encode()
        .with_context(|| format!("encoding {} as a component", input.display()))?;
    std::fs::write(output, component).with_context(|| format!("writing {}", output.display()))?;
    Ok(())
}
