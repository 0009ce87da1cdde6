//! Where each node of a YAML document starts, by path (`rules.3.commands.1`), so that checks made
//! after deserialisation can still point at a line and column.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// How deep mappings and sequences may nest. A policy is four levels deep; the limit stops a
/// hostile file (`[[[[…` a hundred thousand times) before anything recursive reads it.
pub const MAX_DEPTH: usize = 64;

#[derive(Debug, Default)]
pub struct Spans {
    starts: HashMap<String, (usize, usize)>,
}

/// Where a document nests deeper than [`MAX_DEPTH`] (1-based line and column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooDeep {
    pub line: usize,
    pub column: usize,
}

impl Spans {
    /// Spans of `text`, read event by event (yaml-rust2's parser keeps its own stack, so this
    /// does not recurse). A document yaml-rust2 cannot parse yields the spans up to the problem
    /// (serde reports it); one nesting deeper than [`MAX_DEPTH`] is refused where it gets too deep.
    pub fn of(text: &str) -> Result<Spans, TooDeep> {
        let too_deep = |mark: &Marker| TooDeep {
            line: mark.line(),
            column: mark.col() + 1,
        };
        let mut walker = Walker::default();
        let mut parser = Parser::new_from_str(text);
        loop {
            match parser.next_token() {
                Ok((Event::StreamEnd, _)) => break,
                Ok((event, mark)) => {
                    walker.on_event(event, mark);
                    if walker.stack.len() > MAX_DEPTH {
                        return Err(too_deep(&mark));
                    }
                }
                // The scanner looks ahead through flow collections (`[[[…`) and gives up at its
                // own limit (255 levels) before the parser has seen them; its message is the only
                // way it tells this apart from a syntax error.
                Err(error) if error.info().contains("recursion limit") => {
                    return Err(too_deep(error.marker()))
                }
                Err(_) => break,
            }
        }
        Ok(Spans {
            starts: walker.starts,
        })
    }

    /// 1-based line and column of the node at `path`, or of its nearest ancestor that has one.
    pub fn at(&self, path: &str) -> (usize, usize) {
        let mut path = path;
        loop {
            if let Some(&start) = self.starts.get(path) {
                return start;
            }
            match path.rsplit_once('.') {
                Some((parent, _)) => path = parent,
                None => return (1, 1),
            }
        }
    }
}

enum Frame {
    Map { path: String, key: Option<String> },
    Seq { path: String, index: usize },
}

#[derive(Default)]
struct Walker {
    stack: Vec<Frame>,
    starts: HashMap<String, (usize, usize)>,
}

impl Walker {
    /// The path of the node starting now, or `None` when it is a mapping key.
    fn next_path(&mut self, scalar: Option<&str>) -> Option<String> {
        match self.stack.last_mut() {
            None => Some(String::new()),
            Some(Frame::Map {
                key: key @ None, ..
            }) => {
                *key = Some(scalar.unwrap_or_default().to_owned());
                None
            }
            Some(Frame::Map { path, key }) => Some(join(path, &key.take().unwrap_or_default())),
            Some(Frame::Seq { path, index }) => {
                *index += 1;
                Some(join(path, &(*index - 1).to_string()))
            }
        }
    }
}

fn join(parent: &str, segment: &str) -> String {
    if parent.is_empty() {
        segment.to_owned()
    } else {
        format!("{parent}.{segment}")
    }
}

impl MarkedEventReceiver for Walker {
    fn on_event(&mut self, event: Event, mark: Marker) {
        let scalar = match &event {
            Event::Scalar(value, ..) => Some(value.as_str()),
            _ => None,
        };
        match event {
            Event::Scalar(..)
            | Event::Alias(_)
            | Event::MappingStart(..)
            | Event::SequenceStart(..) => {
                let Some(path) = self.next_path(scalar) else {
                    return;
                };
                self.starts
                    .insert(path.clone(), (mark.line(), mark.col() + 1));
                match event {
                    Event::MappingStart(..) => self.stack.push(Frame::Map { path, key: None }),
                    Event::SequenceStart(..) => self.stack.push(Frame::Seq { path, index: 0 }),
                    _ => {}
                }
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_point_at_values() {
        let text = "principals:\n  app: { uids: [1000] }\nrules:\n  - id: a\n    commands: [GET, \"@nope\"]\n";
        let spans = Spans::of(text).unwrap();
        assert_eq!(spans.at("rules.0.commands.1"), (5, 21));
        assert_eq!(spans.at("rules.0.id"), (4, 9));
        assert_eq!(spans.at("principals.app.uids.0"), (2, 17));
        assert_eq!(spans.at("rules.0.missing"), (4, 7));
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_refused_where_it_gets_too_deep() {
        // Block sequences, one level per `- `: the parser sees each level as it opens.
        let block = format!("rules:\n{}x\n", "- ".repeat(100_000));
        assert_eq!(
            Spans::of(&block).unwrap_err(),
            TooDeep {
                line: 2,
                column: 2 * MAX_DEPTH - 1
            }
        );
        // Flow collections: the scanner's look-ahead stops first, still well before the end.
        let flow = format!("rules: {}{}", "[".repeat(100_000), "]".repeat(100_000));
        let deep = Spans::of(&flow).unwrap_err();
        assert_eq!(deep.line, 1);
        assert!(deep.column < 1000, "{deep:?}");
        let mapping = format!("rules: {}1{}", "{a: ".repeat(100_000), "}".repeat(100_000));
        assert!(Spans::of(&mapping).is_err());
        let fine = format!(
            "a: {}{}",
            "[".repeat(MAX_DEPTH - 1),
            "]".repeat(MAX_DEPTH - 1)
        );
        assert!(Spans::of(&fine).is_ok());
    }
}
