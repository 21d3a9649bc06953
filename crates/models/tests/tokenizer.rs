//! Tokenizer and chat-template tests against the real Qwen3 tokenizer files.
//!
//! The files come from `bash scripts/fetch-test-data.sh` (or any folder named by
//! DOMINO_QWEN3_TOKENIZER_DIR holding tokenizer.json and tokenizer_config.json).

use std::path::PathBuf;

use domino_models::tokenizer::{ChatMessage, StreamDecoder, TextTokenizer};
use domino_models::ModelError;

fn qwen3_dir() -> PathBuf {
    let dir = match std::env::var_os("DOMINO_QWEN3_TOKENIZER_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/qwen3-tokenizer"),
    };
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        assert!(
            dir.join(f).is_file(),
            "Qwen3 tokenizer test data missing: {} not found. Run `bash scripts/fetch-test-data.sh` \
             (or set DOMINO_QWEN3_TOKENIZER_DIR to a folder with tokenizer.json and tokenizer_config.json).",
            dir.join(f).display()
        );
    }
    dir
}

fn qwen3() -> TextTokenizer {
    let dir = qwen3_dir();
    match TextTokenizer::from_dir(&dir) {
        Ok(t) => t,
        Err(e) => panic!("loading {}: {e}", dir.display()),
    }
}

#[test]
fn round_trip_varied_text() {
    let tok = qwen3();
    let samples = [
        "Hello world",
        "The quick brown fox jumps over the lazy dog.",
        "fn main() {\n    let x = 1;\n\tif x > 0 {\n\t\tprintln!(\"{x}\");\n\t}\n}\n",
        "def f(a, b):\n    return a ** b  # comment\n",
        "你好，世界！今天天气很好。",
        "emoji: 😀🎉👩‍👩‍👧‍👦 🇫🇷 ❤️",
        "pi = 3.14159, n = 12345678, -0.5e-10",
        "  leading and trailing spaces  ",
        "tabs\tand\r\nCRLF\u{00A0}nbsp\u{2003}em-space\u{200B}zwsp",
        "\n\n\nnewlines\n",
        "Café, naïve, façade, Ångström, São Paulo, Müller",
        "Ελληνικά, русский, العربية, עברית, हिन्दी, 日本語のテキスト",
        "<|im_start|>user\nhi<|im_end|>\n",
        "",
    ];
    for s in samples {
        let ids = tok.encode(s).unwrap();
        let back = tok.decode(&ids).unwrap();
        assert_eq!(back, s, "round trip failed for {s:?} (ids {ids:?})");
    }
}

#[test]
fn known_ids() {
    let tok = qwen3();
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(151644));
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(151645));
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(151643));
    assert_eq!(tok.token_to_id("not a token at all"), None);
    assert_eq!(tok.encode("Hello world").unwrap(), vec![9707, 1879]);
    // Special-token text becomes its single id, and nothing (no BOS) is prepended.
    assert_eq!(tok.encode("<|im_start|>user").unwrap(), vec![151644, 872]);
    // 151643 base tokens + 26 added tokens.
    assert_eq!(tok.vocab_size(), 151669);
}

#[test]
fn decode_skips_padding_ids_past_the_tokenizer() {
    // Qwen3's embedding has 151936 rows but the tokenizer 151669 ids: padding rows decode to nothing.
    let tok = qwen3();
    assert_eq!(tok.decode(&[9707, 151_900]).unwrap(), "Hello");
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(151645));
}

#[test]
fn chat_template_qwen3() {
    let tok = qwen3();
    assert!(tok.has_chat_template());
    let user = [ChatMessage::new("user", "What is 2+2?")];

    let no_think = tok.apply_chat_template(&user, true, false).unwrap();
    assert_eq!(
        no_think,
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    let think = tok.apply_chat_template(&user, true, true).unwrap();
    assert_eq!(think, "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
    let no_prompt = tok.apply_chat_template(&user, false, false).unwrap();
    assert_eq!(no_prompt, "<|im_start|>user\nWhat is 2+2?<|im_end|>\n");

    let conv = [ChatMessage::new("system", "You are terse."), ChatMessage::new("user", "Hi")];
    let out = tok.apply_chat_template(&conv, true, true).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );

    // A multi-turn history exercises the template's Python string methods (.split, .lstrip, ...):
    // the earlier assistant turn's reasoning is dropped, as in HF transformers.
    let multi = [
        ChatMessage::new("user", "What is 2+2?"),
        ChatMessage::new("assistant", "<think>\nadd them\n</think>\n\n4"),
        ChatMessage::new("user", "And 3+3?"),
    ];
    let out = tok.apply_chat_template(&multi, true, false).unwrap();
    assert_eq!(
        out,
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n\
         <|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );

    // The rendered prompt encodes with the markers as single special ids.
    let ids = tok.encode(&think).unwrap();
    assert_eq!(ids.first(), Some(&151644));
    assert_eq!(ids.iter().filter(|&&i| i == 151645).count(), 1);
}

#[test]
fn eos_token_ids_include_im_end() {
    let tok = qwen3();
    assert!(tok.eos_token_ids().contains(&151645), "{:?}", tok.eos_token_ids());
}

#[test]
fn stream_decoder_matches_full_decode() {
    let tok = qwen3();
    let text = "流式解码测试：你好🌍！emoji 👩‍💻 and 中文混合 text. 🎉🎉";
    let ids = tok.encode(text).unwrap();
    // The test only means something if some character spans several tokens.
    let partial = ids.iter().filter(|&&i| tok.decode(&[i]).unwrap().contains('\u{FFFD}')).count();
    assert!(partial > 0, "expected multi-token characters in {ids:?}");

    let mut dec = StreamDecoder::new();
    let mut out = String::new();
    for &id in &ids {
        let piece = dec.push(&tok, id).unwrap();
        assert!(!piece.contains('\u{FFFD}'), "emitted a partial character: {piece:?}");
        out.push_str(&piece);
    }
    out.push_str(&dec.finish(&tok).unwrap());
    assert_eq!(out, tok.decode(&ids).unwrap());
    assert_eq!(out, text);
}

#[test]
fn stream_decoder_finish_flushes_partial_character() {
    let tok = qwen3();
    // A rare character that byte-level BPE splits into several tokens.
    let ids = ["𓀀", "𝄞", "🦩", "🫠"]
        .iter()
        .map(|c| tok.encode(c).unwrap())
        .find(|ids| ids.len() > 1)
        .expect("one of the rare characters should span several tokens");
    let mut dec = StreamDecoder::new();
    let mut out = String::new();
    for &id in &ids[..ids.len() - 1] {
        out.push_str(&dec.push(&tok, id).unwrap());
    }
    assert_eq!(out, "", "nothing should be emitted before the character completes");
    let rest = dec.finish(&tok).unwrap();
    assert_eq!(rest, tok.decode(&ids[..ids.len() - 1]).unwrap());
}

#[test]
fn malformed_tokenizer_json_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, b"{\"model\": [not json").unwrap();
    let err = TextTokenizer::from_dir(dir.path()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("tokenizer.json"), "message should name the file: {msg}");
    assert!(matches!(err, ModelError::Json { .. }), "{err:?}");

    let err = TextTokenizer::from_parts(b"{}", None).unwrap_err();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

#[test]
fn malformed_tokenizer_config_is_an_error() {
    let tok_json = std::fs::read(qwen3_dir().join("tokenizer.json")).unwrap();
    let err = TextTokenizer::from_parts(&tok_json, Some(b"{ nope")).unwrap_err();
    assert!(err.to_string().contains("tokenizer_config.json"), "{err}");
}

#[test]
fn missing_dir_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("does-not-exist");
    match TextTokenizer::from_dir(&gone) {
        Err(ModelError::Missing { path }) => assert!(path.ends_with("tokenizer.json"), "{}", path.display()),
        other => panic!("expected ModelError::Missing, got {other:?}"),
    }
}

#[test]
fn no_template_and_config_shapes() {
    let tok_json = std::fs::read(qwen3_dir().join("tokenizer.json")).unwrap();
    let bare = TextTokenizer::from_parts(&tok_json, None).unwrap();
    assert!(!bare.has_chat_template());
    assert!(bare.eos_token_ids().is_empty());
    let err = bare.apply_chat_template(&[ChatMessage::new("user", "hi")], true, false).unwrap_err();
    assert!(matches!(err, ModelError::ChatTemplate(_)), "{err:?}");

    // Object-form special tokens, list-form templates, raise_exception, and bos/eos variables.
    let cfg = br#"{
        "eos_token": {"content": "<|endoftext|>", "lstrip": false},
        "bos_token": null,
        "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}{% for m in messages %}{{ m.content | upper }}{% endfor %}{{ eos_token }}"}
        ]
    }"#;
    let tok = TextTokenizer::from_parts(&tok_json, Some(cfg)).unwrap();
    assert_eq!(tok.eos_token_ids(), vec![151643]);
    assert_eq!(tok.apply_chat_template(&[ChatMessage::new("user", "hi")], false, false).unwrap(), "HI<|endoftext|>");
    let err = tok.apply_chat_template(&[ChatMessage::new("assistant", "x")], false, false).unwrap_err();
    assert!(err.to_string().contains("first must be user"), "{err}");
}
