//! Stop strings over streamed text: what may be sent now, and where the text ends.

/// Accumulates a completion's text and releases it as soon as no stop string can begin in it:
/// text that could be the start of a stop string is held back until the next piece decides.
#[derive(Debug)]
pub struct StopText {
    stops: Vec<String>,
    text: String,
    /// Bytes of `text` released.
    sent: usize,
    stopped: bool,
}

impl StopText {
    /// Empty stop strings are ignored.
    pub fn new(stops: Vec<String>) -> Self {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        Self { stops, text: String::new(), sent: 0, stopped: false }
    }

    /// Whether a stop string was found: the text ended before it.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Adds `piece`; returns the text released (possibly empty). After a stop string is found,
    /// the rest is dropped.
    pub fn push(&mut self, piece: &str) -> String {
        if self.stopped {
            return String::new();
        }
        // A stop string may start inside the text held back, never before it.
        let from = self.sent;
        self.text.push_str(piece);
        let hit = self.stops.iter().filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i)).min();
        if let Some(end) = hit {
            self.stopped = true;
            let out = self.text[self.sent..end].to_string();
            self.sent = end;
            self.text.truncate(end);
            return out;
        }
        let keep = self.stops.iter().map(|s| held(&self.text[self.sent..], s)).max().unwrap_or(0);
        let end = self.text.len() - keep;
        let out = self.text[self.sent..end].to_string();
        self.sent = end;
        out
    }

    /// The text held back, released at the end of the completion.
    pub fn finish(&mut self) -> String {
        let out = self.text[self.sent..].to_string();
        self.sent = self.text.len();
        out
    }

    /// The whole text released so far (without a stop string).
    pub fn text(&self) -> &str {
        &self.text[..self.sent]
    }
}

/// The longest suffix of `text` that is a proper prefix of `stop` (bytes, at character
/// boundaries).
pub(super) fn held(text: &str, stop: &str) -> usize {
    (1..stop.len().min(text.len() + 1))
        .rev()
        .find(|&k| stop.is_char_boundary(k) && text.is_char_boundary(text.len() - k) && text.ends_with(&stop[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` one at a time; returns the concatenated output and whether it stopped.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool, Vec<String>) {
        let mut s = StopText::new(stops.iter().map(|s| s.to_string()).collect());
        let mut outs = Vec::new();
        for p in pieces {
            outs.push(s.push(p));
        }
        outs.push(s.finish());
        (outs.concat(), s.stopped(), outs)
    }

    #[test]
    fn no_stops_passes_everything_at_once() {
        let (text, stopped, outs) = run(&[], &["Hello", ", wor", "ld"]);
        assert_eq!(text, "Hello, world");
        assert!(!stopped);
        assert_eq!(outs, ["Hello", ", wor", "ld", ""]);
    }

    #[test]
    fn stop_inside_a_piece_and_across_pieces() {
        assert_eq!(run(&["END"], &["abcENDdef"]).0, "abc");
        let (text, stopped, outs) = run(&["END"], &["ab", "cE", "N", "Dxyz", "more"]);
        assert_eq!(text, "abc");
        assert!(stopped);
        // "E" and "EN" were held back, never released.
        assert_eq!(outs, ["ab", "c", "", "", "", ""]);
    }

    #[test]
    fn a_false_start_is_released_when_it_cannot_match() {
        let (text, stopped, outs) = run(&["END"], &["xE", "Ny", "z"]);
        assert_eq!(text, "xENyz");
        assert!(!stopped);
        assert_eq!(outs, ["x", "ENy", "z", ""]);
        // Held back at the end of the completion: released by finish.
        let (text, _, outs) = run(&["END"], &["xEN"]);
        assert_eq!(text, "xEN");
        assert_eq!(outs, ["x", "EN"]);
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(run(&["bc", "a"], &["xxabc"]).0, "xx");
        assert_eq!(run(&["\n\n", "User:"], &["one\n", "User: two"]).0, "one\n");
    }

    #[test]
    fn multibyte_text_splits_at_characters() {
        let (text, stopped, _) = run(&["日本語"], &["東京は日", "本", "語です"]);
        assert_eq!(text, "東京は");
        assert!(stopped);
        let (text, stopped, outs) = run(&["é!"], &["café", " ok"]);
        assert_eq!(text, "café ok");
        assert!(!stopped);
        assert_eq!(outs, ["caf", "é ok", ""]);
    }
}
