//! The JavaScript side: the file snippet (js/files.js) and small helpers for reading option objects.

use js_sys::{Function, Promise, Reflect, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

#[wasm_bindgen(module = "/js/files.js")]
extern "C" {
    #[wasm_bindgen(js_name = openFolder)]
    pub fn open_folder(source: &JsValue, on_progress: &JsValue, drafter: bool) -> Promise;
    #[wasm_bindgen(js_name = weightFiles)]
    pub fn weight_files(folder: &JsValue) -> Promise;
    #[wasm_bindgen(js_name = fileBytes)]
    pub fn file_bytes(folder: &JsValue, name: &str) -> Promise;
    #[wasm_bindgen(js_name = fileBlob)]
    pub fn file_blob(folder: &JsValue, name: &str) -> JsValue;
    #[wasm_bindgen(js_name = readSync, catch)]
    pub fn read_sync(blob: &JsValue, start: f64, end: f64) -> Result<Uint8Array, JsValue>;
}

/// The message of a JS exception (Error.message, or the value as a string).
pub fn message(e: &JsValue) -> String {
    if let Some(err) = e.dyn_ref::<js_sys::Error>() {
        return String::from(err.message());
    }
    e.as_string().unwrap_or_else(|| format!("{e:?}"))
}

/// Await a JS promise, turning a rejection into its message.
pub async fn wait(p: Promise) -> Result<JsValue, String> {
    wasm_bindgen_futures::JsFuture::from(p).await.map_err(|e| message(&e))
}

/// Typed reads of an options object (`{ prompt, maxTokens, ... }`); a wrong type is an error that
/// names the option, an absent or undefined/null one is None.
pub struct Options<'a> {
    obj: &'a JsValue,
    what: &'static str,
}

impl<'a> Options<'a> {
    pub fn new(obj: &'a JsValue, what: &'static str) -> Result<Self, String> {
        if !obj.is_undefined() && !obj.is_null() && !obj.is_object() {
            return Err(format!("{what}: expected an options object"));
        }
        Ok(Self { obj, what })
    }

    pub fn raw(&self, key: &str) -> Option<JsValue> {
        if self.obj.is_undefined() || self.obj.is_null() {
            return None;
        }
        let v = Reflect::get(self.obj, &JsValue::from_str(key)).ok()?;
        if v.is_undefined() || v.is_null() {
            None
        } else {
            Some(v)
        }
    }

    fn bad(&self, key: &str, want: &str) -> String {
        format!("{}: option '{key}' must be {want}", self.what)
    }

    pub fn string(&self, key: &str) -> Result<Option<String>, String> {
        self.raw(key).map(|v| v.as_string().ok_or_else(|| self.bad(key, "a string"))).transpose()
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>, String> {
        self.raw(key).map(|v| v.as_bool().ok_or_else(|| self.bad(key, "true or false"))).transpose()
    }

    pub fn number(&self, key: &str) -> Result<Option<f64>, String> {
        self.raw(key).map(|v| v.as_f64().filter(|x| x.is_finite()).ok_or_else(|| self.bad(key, "a finite number"))).transpose()
    }

    /// A non-negative integer below `max`.
    pub fn uint(&self, key: &str, max: f64) -> Result<Option<u64>, String> {
        match self.number(key)? {
            Some(x) if x >= 0.0 && x.fract() == 0.0 && x <= max => Ok(Some(x as u64)),
            Some(_) => Err(self.bad(key, &format!("an integer in [0, {max}]"))),
            None => Ok(None),
        }
    }

    pub fn function(&self, key: &str) -> Result<Option<Function>, String> {
        self.raw(key).map(|v| v.dyn_into::<Function>().map_err(|_| self.bad(key, "a function"))).transpose()
    }

    /// An array (or typed array) of token ids.
    pub fn ids(&self, key: &str) -> Result<Option<Vec<u32>>, String> {
        let Some(v) = self.raw(key) else { return Ok(None) };
        let arr = js_sys::Array::from(&v);
        if arr.length() == 0 && !js_sys::Array::is_array(&v) && !v.is_instance_of::<js_sys::Uint32Array>() {
            return Err(self.bad(key, "an array of token ids"));
        }
        let mut ids = Vec::with_capacity(arr.length() as usize);
        for x in arr.iter() {
            match x.as_f64() {
                Some(n) if n >= 0.0 && n.fract() == 0.0 && n <= u32::MAX as f64 => ids.push(n as u32),
                _ => return Err(self.bad(key, "an array of non-negative integer token ids")),
            }
        }
        Ok(Some(ids))
    }
}

/// A serde value as a plain JS object (through JSON, so the key order and shape are exactly what
/// `domino generate --json` / `domino bench --json` print).
pub fn to_js(v: &serde_json::Value) -> Result<JsValue, String> {
    let text = serde_json::to_string(v).map_err(|e| e.to_string())?;
    js_sys::JSON::parse(&text).map_err(|e| message(&e))
}
