//! Tokens to streamed text with stop sequences: text that could still become a stop sequence is
//! held back until it cannot, and a completed stop sequence ends the text before it (it is not
//! part of the output, as in OpenAI's API).

use domino_models::tokenizer::{StreamDecoder, TextTokenizer};
use std::sync::Arc;

pub struct TextStream {
    tok: Arc<TextTokenizer>,
    decoder: StreamDecoder,
    stops: Vec<String>,
    /// Decoded text not yet emitted (a possible start of a stop sequence).
    held: String,
    stopped: bool,
}

impl TextStream {
    pub fn new(tok: Arc<TextTokenizer>, stops: Vec<String>) -> Self {
        Self { tok, decoder: StreamDecoder::new(), stops, held: String::new(), stopped: false }
    }

    /// Whether a stop sequence has ended the text.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Add a token; returns the text that is now final.
    pub fn push(&mut self, id: u32) -> Result<String, domino_models::ModelError> {
        if self.stopped {
            return Ok(String::new());
        }
        let piece = self.decoder.push(&self.tok, id)?;
        Ok(self.take(&piece))
    }

    /// The end of generation: whatever is still held back (no stop sequence completed).
    pub fn finish(&mut self) -> Result<String, domino_models::ModelError> {
        if self.stopped {
            return Ok(String::new());
        }
        let piece = self.decoder.finish(&self.tok)?;
        let mut out = self.take(&piece);
        if !self.stopped {
            out.push_str(&std::mem::take(&mut self.held));
        }
        Ok(out)
    }

    fn take(&mut self, piece: &str) -> String {
        self.held.push_str(piece);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            self.stopped = true;
            let out = self.held[..at].to_string();
            self.held.clear();
            return out;
        }
        // Keep the longest tail that is a proper prefix of some stop sequence.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| (1..s.len()).rev().filter(|&n| s.is_char_boundary(n)).map(move |n| &s[..n]))
            .filter(|p| self.held.ends_with(p))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> TextTokenizer {
        let json = serde_json::to_vec(&domino_models::testing::tokenizer_json()).unwrap();
        TextTokenizer::from_parts(&json, None).unwrap()
    }

    fn run(stops: &[&str], text: &str) -> (String, bool) {
        let tok = Arc::new(tokenizer());
        let ids = tok.encode(text).unwrap();
        let mut s = TextStream::new(tok.clone(), stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for id in ids {
            out += &s.push(id).unwrap();
            if s.stopped() {
                break;
            }
        }
        out += &s.finish().unwrap();
        (out, s.stopped())
    }

    #[test]
    fn stop_sequences_end_the_text_before_them() {
        assert_eq!(run(&[], "hello world"), ("hello world".into(), false));
        assert_eq!(run(&["wor"], "hello world"), ("hello ".into(), true));
        assert_eq!(run(&["xyz", "lo w"], "hello world"), ("hel".into(), true));
        // A partial match at the end is released when generation ends.
        assert_eq!(run(&["dx"], "hello world"), ("hello world".into(), false));
        assert_eq!(run(&["world!"], "hello world"), ("hello world".into(), false));
    }
}
