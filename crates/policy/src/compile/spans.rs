//! Where each node of a YAML document starts, by path (`rules.3.commands.1`), so that checks made
//! after deserialisation can still point at a line and column.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

#[derive(Debug, Default)]
pub struct Spans {
    starts: HashMap<String, (usize, usize)>,
}

impl Spans {
    /// Spans of `text`; a document yaml-rust2 cannot parse yields no spans (serde reports it).
    pub fn of(text: &str) -> Spans {
        let mut walker = Walker::default();
        let _ = Parser::new_from_str(text).load(&mut walker, false);
        Spans {
            starts: walker.starts,
        }
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
        let spans = Spans::of(text);
        assert_eq!(spans.at("rules.0.commands.1"), (5, 21));
        assert_eq!(spans.at("rules.0.id"), (4, 9));
        assert_eq!(spans.at("principals.app.uids.0"), (2, 17));
        assert_eq!(spans.at("rules.0.missing"), (4, 7));
    }
}
