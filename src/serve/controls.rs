//! The request fields of the logit controls ([`crate::sampling::penalty`]): OpenAI's
//! `logit_bias` (a map from a token id, as a string, to a bias in [-100, 100]),
//! `presence_penalty` and `frequency_penalty` (in [-2, 2]), and llama.cpp's server extensions
//! `repeat_penalty` (> 0, 1 = off) and `repeat_last_n` (0 = off, -1 = every token, up to
//! [`MAX_WINDOW`]; llama.cpp's default 64). Absent or `null`: off. A malformed or out-of-range
//! value is a 400 naming the field (the API's error is made from [`Refusal`] by `api`); a
//! biased token outside the vocabulary is refused by the engine (also naming `logit_bias`).

use crate::sampling::penalty::{LogitControls, MAX_WINDOW, REPEAT_ALL};
use serde_json::{Map, Value};

/// A field's name and why its value is refused.
pub type Refusal = (&'static str, String);

/// The controls `fields` (a request's fields besides those the server reads itself) ask for.
pub fn logit_controls(fields: &Map<String, Value>) -> Result<LogitControls, Refusal> {
    let mut c = LogitControls::default();
    let present = |name: &str| fields.get(name).filter(|v| !v.is_null());
    let number = |name: &'static str| -> Result<Option<f32>, Refusal> {
        match present(name) {
            None => Ok(None),
            Some(v) => {
                v.as_f64().map(|x| Some(x as f32)).ok_or_else(|| (name, format!("{name} must be a number, not {v}")))
            }
        }
    };
    if let Some(v) = present("logit_bias") {
        let bad = |m: String| ("logit_bias", m);
        let Value::Object(map) = v else {
            return Err(bad(format!("logit_bias must be an object mapping token ids to biases, not {v}")));
        };
        for (token, bias) in map {
            let t: u32 = token.parse().map_err(|_| bad(format!("logit_bias keys must be token ids, got '{token}'")))?;
            let b =
                bias.as_f64().ok_or_else(|| bad(format!("logit_bias of token {t} must be a number, not {bias}")))?;
            if !(-100.0..=100.0).contains(&b) {
                return Err(bad(format!("logit_bias of token {t} must be in [-100, 100], got {b}")));
            }
            c.logit_bias.push((t, b as f32));
        }
    }
    if let Some(p) = number("presence_penalty")? {
        c.presence_penalty = p;
    }
    if let Some(p) = number("frequency_penalty")? {
        c.frequency_penalty = p;
    }
    if let Some(p) = number("repeat_penalty")? {
        c.repeat_penalty = p;
    }
    if let Some(v) = present("repeat_last_n") {
        let bad = || {
            let m =
                format!("repeat_last_n must be an integer: 0 (off), 1 to {MAX_WINDOW}, or -1 (every token), not {v}");
            ("repeat_last_n", m)
        };
        c.repeat_last_n = match v.as_i64().ok_or_else(bad)? {
            -1 => REPEAT_ALL,
            n if (0..=i64::from(MAX_WINDOW)).contains(&n) => n as u32,
            _ => return Err(bad()),
        };
    }
    c.check()?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<LogitControls, Refusal> {
        logit_controls(v.as_object().expect("an object"))
    }

    #[test]
    fn fields_become_controls() {
        assert!(parse(json!({})).unwrap().is_off());
        assert!(parse(json!({"logit_bias": null, "presence_penalty": null, "repeat_last_n": null})).unwrap().is_off());
        let c = parse(json!({
            "logit_bias": {"7": 100, "3": -5.5}, "presence_penalty": 0.5, "frequency_penalty": -1,
            "repeat_penalty": 1.3, "repeat_last_n": -1,
        }))
        .unwrap();
        let mut bias = c.logit_bias.clone();
        bias.sort_by_key(|b| b.0);
        assert_eq!(bias, vec![(3, -5.5), (7, 100.0)]);
        assert_eq!((c.presence_penalty, c.frequency_penalty, c.repeat_penalty), (0.5, -1.0, 1.3));
        assert_eq!(c.repeat_last_n, REPEAT_ALL);
        assert_eq!(parse(json!({"repeat_last_n": 16})).unwrap().repeat_last_n, 16);
    }

    #[test]
    fn bad_values_are_refused_naming_the_field() {
        for (v, field) in [
            (json!({"logit_bias": {"x": 1}}), "logit_bias"),
            (json!({"logit_bias": {"5": 101}}), "logit_bias"),
            (json!({"logit_bias": {"5": "high"}}), "logit_bias"),
            (json!({"logit_bias": [1, 2]}), "logit_bias"),
            (json!({"presence_penalty": 2.5}), "presence_penalty"),
            (json!({"frequency_penalty": "a"}), "frequency_penalty"),
            (json!({"frequency_penalty": -3}), "frequency_penalty"),
            (json!({"repeat_penalty": 0}), "repeat_penalty"),
            (json!({"repeat_penalty": -1.1}), "repeat_penalty"),
            (json!({"repeat_last_n": -2}), "repeat_last_n"),
            (json!({"repeat_last_n": 1.5}), "repeat_last_n"),
            (json!({"repeat_last_n": 1_000_000}), "repeat_last_n"),
        ] {
            let (name, message) = parse(v.clone()).unwrap_err();
            assert_eq!(name, field, "{v}");
            assert!(message.contains(field), "{v}: {message}");
        }
    }
}
