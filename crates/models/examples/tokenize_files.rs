//! Tokenize text files with a model's tokenizer: one JSON array of token ids per line of stdout.
//! `cargo run --release -p domino-models --example tokenize_files -- MODEL FILE...`
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let files = domino_models::open_model(std::path::Path::new(&args[1]))?;
    let tok = files.tokenizer.ok_or("no tokenizer")?;
    for f in &args[2..] {
        let Ok(text) = std::fs::read_to_string(f) else { continue };
        let ids = tok.encode(&text)?;
        println!("{}", serde_json::to_string(&ids)?);
    }
    Ok(())
}
