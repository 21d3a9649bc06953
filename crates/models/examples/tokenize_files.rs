//! Tokenize text files with a model's tokenizer: one JSON array of token ids per file, one per line
//! of stdout. `cargo run --release -p domino-models --example tokenize_files -- MODEL FILE...`
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = args.get(1).ok_or("usage: tokenize_files MODEL FILE...")?;
    let files = domino_models::open_model(std::path::Path::new(model))?;
    let tok = files.tokenizer.ok_or_else(|| format!("{model}: no tokenizer"))?;
    for f in &args[2..] {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{f}: {e}"))?;
        let ids = tok.encode(&text)?;
        println!("{}", serde_json::to_string(&ids)?);
    }
    Ok(())
}
