//! Function libraries as tenants' own: pure decisions on a `FUNCTION LOAD`'s code and on Redis's
//! `FUNCTION LIST` and `FUNCTION STATS` answers, for the namespace (`namespace.rs`).
//!
//! Which tenant loaded a library is written into the library itself, as its last line
//! (`-- tollgate-owner: acme`), when a key-confined principal loads it through the daemon. So the
//! owner is kept by Redis with the code: across daemon restarts, in RDB and AOF, on replicas and
//! after a failover, with no state of the daemon's to lose. The last line is a Lua comment (line
//! numbers in Lua's errors do not move) and the owner is read from the last line only: a tenant
//! that writes such a line into its own code has the daemon's appended after it. The owner sees
//! its code as it loaded it (the line is taken off again); a library without the line is the
//! operator's (loaded directly, or by an unconstrained principal).

use bytes::{Bytes, BytesMut};
use tollgate_resp::Frame;

/// How the owner's line begins.
const OWNER_LINE: &str = "-- tollgate-owner: ";

/// A library's name, as a `FUNCTION LOAD`'s first line gives it (`#!lua name=mylib`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    Library(String),
    /// A first line the daemon will not read for a tenant, with why.
    Unreadable(&'static str),
}

/// The library name in `code`'s first line. Redis splits that line as `sdssplitargs` does, where a
/// quote anywhere starts a quoted string: a first line with a quote or a backslash is refused
/// rather than read differently from Redis. The name is checked as Redis checks it (letters,
/// digits and `_`), so that no name the daemon reads differs from the one Redis keeps.
pub fn library_name(code: &[u8]) -> Named {
    let Some(first) = code
        .split(|&b| b == b'\n')
        .next()
        .filter(|_| code.contains(&b'\n'))
    else {
        return Named::Unreadable("the code has no first line of its own (`#!lua name=<name>`)");
    };
    if !first.starts_with(b"#!") {
        return Named::Unreadable("the code does not begin with `#!lua name=<name>`");
    }
    if first.iter().any(|b| matches!(b, b'"' | b'\'' | b'\\')) {
        return Named::Unreadable("its first line has quotes or backslashes");
    }
    let mut names = first
        .split(|b| b.is_ascii_whitespace())
        .filter(|part| part.len() > 5 && part[..5].eq_ignore_ascii_case(b"name="))
        .map(|part| &part[5..]);
    match (names.next(), names.next()) {
        (Some(name), None) if name.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_') => {
            Named::Library(String::from_utf8_lossy(name).into_owned())
        }
        (Some(_), None) => Named::Unreadable("its library name is not letters, digits and `_`"),
        (Some(_), Some(_)) => Named::Unreadable("its first line names the library twice"),
        (None, _) => Named::Unreadable("its first line gives no `name=`"),
    }
}

/// `code` with `owner`'s line appended.
pub fn owned(code: &[u8], owner: &str) -> Bytes {
    let mut out = BytesMut::with_capacity(code.len() + OWNER_LINE.len() + owner.len() + 1);
    out.extend_from_slice(code);
    out.extend_from_slice(b"\n");
    out.extend_from_slice(OWNER_LINE.as_bytes());
    out.extend_from_slice(owner.as_bytes());
    out.freeze()
}

/// Who loaded the library whose stored code is `code`; `None`: the operator.
pub fn owner(code: &[u8]) -> Option<&str> {
    let last = code.rsplit(|&b| b == b'\n').next()?;
    let name = last.strip_prefix(OWNER_LINE.as_bytes())?;
    // A line without a newline before it is the code's only line: never the daemon's.
    (code.len() > last.len())
        .then(|| std::str::from_utf8(name).ok())
        .flatten()
}

/// `code` as its owner loaded it: without the owner's line.
pub fn as_loaded(code: &Bytes) -> Bytes {
    match owner(code) {
        Some(name) => code.slice(..code.len() - OWNER_LINE.len() - name.len() - 1),
        None => code.clone(),
    }
}

/// One library of a `FUNCTION LIST` answer: its name, its owner (when its code was asked for) and
/// its functions' names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub owner: Option<String>,
    pub functions: Vec<String>,
}

/// The fields of a RESP2 pair list or a RESP3 map, as pairs.
fn fields(frame: &Frame) -> Option<Vec<(&Frame, &Frame)>> {
    match frame {
        Frame::Array(items) if items.len() % 2 == 0 => {
            Some(items.chunks_exact(2).map(|p| (&p[0], &p[1])).collect())
        }
        Frame::Map(pairs) => Some(pairs.iter().map(|(k, v)| (k, v)).collect()),
        _ => None,
    }
}

fn field<'f>(frame: &'f Frame, name: &str) -> Option<&'f Frame> {
    fields(frame)?
        .into_iter()
        .find(|(key, _)| key.as_bytes().is_some_and(|key| key == name))
        .map(|(_, value)| value)
}

fn text(frame: &Frame) -> Option<String> {
    frame
        .as_bytes()
        .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
}

/// The libraries of a `FUNCTION LIST … WITHCODE` answer; `None` for an answer of another shape.
pub fn listed(reply: &Frame) -> Option<Vec<Listed>> {
    let (Frame::Array(libraries) | Frame::Set(libraries)) = reply else {
        return None;
    };
    libraries
        .iter()
        .map(|library| {
            let name = text(field(library, "library_name")?)?;
            let owner = field(library, "library_code")
                .and_then(Frame::as_bytes)
                .and_then(|code| owner(code))
                .map(str::to_owned);
            let functions = match field(library, "functions")? {
                Frame::Array(functions) | Frame::Set(functions) => functions
                    .iter()
                    .map(|function| text(field(function, "name")?))
                    .collect::<Option<Vec<_>>>()?,
                _ => return None,
            };
            Some(Listed {
                name,
                owner,
                functions,
            })
        })
        .collect()
}

/// A `FUNCTION LIST … WITHCODE` answer cut to `owner`'s libraries, each code as loaded, and the
/// code left out unless the client asked for it. `None` for an answer of another shape.
pub fn own_libraries(reply: Frame, owner_name: &str, with_code: bool) -> Option<Frame> {
    let Frame::Array(libraries) = reply else {
        return None;
    };
    let mine = |library: &Frame| {
        field(library, "library_code")
            .and_then(Frame::as_bytes)
            .and_then(|code| owner(code))
            == Some(owner_name)
    };
    let edit_pairs = |pairs: Vec<(Frame, Frame)>| -> Vec<(Frame, Frame)> {
        pairs
            .into_iter()
            .filter_map(|(key, value)| {
                if key.as_bytes().is_some_and(|key| key == "library_code") {
                    let code = value.as_bytes()?;
                    with_code.then(|| (key, Frame::Bulk(as_loaded(code))))
                } else {
                    Some((key, value))
                }
            })
            .collect()
    };
    let kept = libraries
        .into_iter()
        .filter(mine)
        .map(|library| match library {
            Frame::Map(pairs) => Some(Frame::Map(edit_pairs(pairs))),
            Frame::Array(items) => {
                let mut items = items.into_iter();
                let mut pairs = Vec::new();
                while let (Some(key), Some(value)) = (items.next(), items.next()) {
                    pairs.push((key, value));
                }
                Some(Frame::Array(
                    edit_pairs(pairs)
                        .into_iter()
                        .flat_map(|(key, value)| [key, value])
                        .collect(),
                ))
            }
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Frame::Array(kept))
}

/// The name of the function `FUNCTION STATS` says Redis is running; `None` when nothing runs
/// (or the answer has another shape: `BUSY` while an `EVAL` runs).
pub fn running_function(stats: &Frame) -> Option<String> {
    let running = field(stats, "running_script")?;
    text(field(running, "name")?)
}

/// `FUNCTION STATS`'s answer with its running script hidden (`null`), for a caller whose script
/// it is not; the engines' counts stay (they are the server's).
pub fn hide_running(stats: Frame, null: Frame) -> Frame {
    let hide = |key: Frame, value: Frame| {
        if key.as_bytes().is_some_and(|key| key == "running_script") {
            (key, null.clone())
        } else {
            (key, value)
        }
    };
    match stats {
        Frame::Map(pairs) => Frame::Map(pairs.into_iter().map(|(k, v)| hide(k, v)).collect()),
        Frame::Array(items) if items.len() % 2 == 0 => {
            let mut out = Vec::with_capacity(items.len());
            let mut items = items.into_iter();
            while let (Some(key), Some(value)) = (items.next(), items.next()) {
                let (key, value) = hide(key, value);
                out.push(key);
                out.push(value);
            }
            Frame::Array(out)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Frame {
        Frame::Bulk(Bytes::copy_from_slice(text.as_bytes()))
    }

    /// A library as `FUNCTION LIST WITHCODE` gives it in RESP2.
    fn library(name: &str, code: &[u8], functions: &[&str]) -> Frame {
        Frame::Array(vec![
            bulk("library_name"),
            bulk(name),
            bulk("engine"),
            bulk("LUA"),
            bulk("functions"),
            Frame::Array(
                functions
                    .iter()
                    .map(|f| {
                        Frame::Array(vec![
                            bulk("name"),
                            bulk(f),
                            bulk("description"),
                            Frame::Null,
                            bulk("flags"),
                            Frame::Array(vec![]),
                        ])
                    })
                    .collect(),
            ),
            bulk("library_code"),
            Frame::Bulk(Bytes::copy_from_slice(code)),
        ])
    }

    #[test]
    fn the_library_name_is_read_as_redis_reads_it_or_refused() {
        let named = |code: &str| library_name(code.as_bytes());
        assert_eq!(
            named("#!lua name=mylib\nreturn 1"),
            Named::Library("mylib".into())
        );
        assert_eq!(
            named("#!lua   NAME=My_Lib2\r\nreturn 1"),
            Named::Library("My_Lib2".into())
        );
        assert!(matches!(named("#!lua name=a\"b\nx"), Named::Unreadable(_)));
        assert!(matches!(named("#!lua name='x'\nx"), Named::Unreadable(_)));
        assert!(matches!(named("#!lua name=a-b\nx"), Named::Unreadable(_)));
        assert!(matches!(
            named("#!lua name=a name=b\nx"),
            Named::Unreadable(_)
        ));
        assert!(matches!(named("#!lua\nx"), Named::Unreadable(_)));
        assert!(matches!(named("#!lua name=x"), Named::Unreadable(_)));
        assert!(matches!(named("lua name=x\ny"), Named::Unreadable(_)));
    }

    #[test]
    fn the_owner_is_the_last_line_the_daemon_appended_and_comes_off_again() {
        let code = b"#!lua name=l\nredis.register_function('f', function() return 1 end)";
        let stored = owned(code, "acme");
        assert_eq!(owner(&stored), Some("acme"));
        assert_eq!(&as_loaded(&stored)[..], &code[..]);
        assert_eq!(owner(code), None);
        // A tenant that forges the line in its own code has the daemon's after it.
        let forged = owned(b"#!lua name=l\nx()\n-- tollgate-owner: globex", "acme");
        assert_eq!(owner(&forged), Some("acme"));
        // A code of one line is never the daemon's.
        assert_eq!(owner(b"-- tollgate-owner: acme"), None);
    }

    #[test]
    fn a_list_is_cut_to_the_callers_libraries_with_their_code_as_loaded() {
        let mine = owned(b"#!lua name=a\nx()", "acme");
        let theirs = owned(b"#!lua name=g\ny()", "globex");
        let reply = Frame::Array(vec![
            library("a", &mine, &["fa"]),
            library("g", &theirs, &["fg"]),
            library("op", b"#!lua name=op\nz()", &["fo"]),
        ]);
        let seen = listed(&reply).unwrap();
        assert_eq!(
            seen.iter()
                .map(|l| (l.name.as_str(), l.owner.as_deref(), l.functions.clone()))
                .collect::<Vec<_>>(),
            vec![
                ("a", Some("acme"), vec!["fa".to_owned()]),
                ("g", Some("globex"), vec!["fg".to_owned()]),
                ("op", None, vec!["fo".to_owned()]),
            ]
        );
        let with = own_libraries(reply.clone(), "acme", true).unwrap();
        assert_eq!(
            with,
            Frame::Array(vec![library("a", b"#!lua name=a\nx()", &["fa"])])
        );
        let Frame::Array(without) = own_libraries(reply, "acme", false).unwrap() else {
            panic!()
        };
        assert_eq!(without.len(), 1);
        assert!(field(&without[0], "library_code").is_none());
        assert!(field(&without[0], "functions").is_some());
    }

    #[test]
    fn a_resp3_list_is_cut_the_same_way() {
        let mine = owned(b"#!lua name=a\nx()", "acme");
        let map = |name: &str, code: Bytes| {
            Frame::Map(vec![
                (bulk("library_name"), bulk(name)),
                (bulk("functions"), Frame::Array(vec![])),
                (bulk("library_code"), Frame::Bulk(code)),
            ])
        };
        let reply = Frame::Array(vec![
            map("a", mine),
            map("g", owned(b"#!lua name=g\ny()", "globex")),
        ]);
        let kept = own_libraries(reply, "acme", true).unwrap();
        assert_eq!(
            kept,
            Frame::Array(vec![map("a", Bytes::from_static(b"#!lua name=a\nx()"))])
        );
    }

    #[test]
    fn the_running_function_is_read_and_hidden() {
        let stats = Frame::Array(vec![
            bulk("running_script"),
            Frame::Array(vec![
                bulk("name"),
                bulk("spin"),
                bulk("command"),
                Frame::Array(vec![bulk("FCALL"), bulk("spin"), bulk("0")]),
                bulk("duration_ms"),
                Frame::Integer(12),
            ]),
            bulk("engines"),
            Frame::Array(vec![]),
        ]);
        assert_eq!(running_function(&stats).as_deref(), Some("spin"));
        let hidden = hide_running(stats, Frame::Null);
        assert_eq!(running_function(&hidden), None);
        assert_eq!(field(&hidden, "running_script"), Some(&Frame::Null));
        assert!(field(&hidden, "engines").is_some());
        assert_eq!(running_function(&Frame::Error("BUSY x".into())), None);
    }
}
