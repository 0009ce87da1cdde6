//! The RESP command parser (`tollgate_resp::parse_command`), as a hostile client feeds it: it
//! returns a command, asks for more without consuming anything, or returns a typed error; never
//! panics or spins; gives the same commands and the same end however the bytes are split; and
//! reads back exactly what `encode_command` wrote.

use bytes::BytesMut;
use proptest::prelude::*;
use tollgate_resp::{encode_command, parse_command, Limits, ProtocolError};

use crate::mutate::{apply, cuts, mutations};
use crate::support::check;

/// Bytes that mean something in a command frame.
const SPECIALS: &[u8] = b"*$\r\n-+:0123456789 \"'\\";

/// How reading a buffer ended, after the commands it gave.
#[derive(Debug, PartialEq)]
enum End {
    /// Waiting for more: this many bytes are buffered, unconsumed.
    Incomplete(usize),
    Error(ProtocolError),
}

#[derive(Debug, PartialEq)]
struct Read {
    commands: Vec<Vec<Vec<u8>>>,
    end: End,
}

fn limits() -> impl Strategy<Value = Limits> {
    prop_oneof![
        Just(Limits::default()),
        (8usize..512, 1usize..8, 2usize..64).prop_map(|(frame, elements, inline)| Limits {
            max_frame_bytes: frame,
            max_elements: elements,
            max_depth: 4,
            max_inline_bytes: inline,
        }),
    ]
}

fn argv() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let word = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..24),
        "[A-Za-z]{1,8}".prop_map(String::into_bytes),
    ];
    proptest::collection::vec(word, 1..8)
}

/// One piece of a client's stream: a well-formed command, an inline line, or noise.
fn piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => argv().prop_map(|argv| {
            let mut out = BytesMut::new();
            encode_command(&argv, &mut out);
            out.to_vec()
        }),
        2 => "[ -~]{0,40}(\r\n|\n)".prop_map(String::into_bytes),
        1 => proptest::collection::vec(any::<u8>(), 0..32),
    ]
}

/// A stream of pieces with mutations, the limits to read it under, and where to cut it.
fn stream() -> impl Strategy<Value = (Vec<u8>, Limits, Vec<usize>)> {
    (
        proptest::collection::vec(piece(), 1..6),
        mutations(4, SPECIALS),
        limits(),
        proptest::collection::vec(any::<usize>(), 0..12),
    )
        .prop_map(|(pieces, mutations, limits, cuts)| {
            (apply(pieces.concat(), &mutations), limits, cuts)
        })
}

/// Reads every command `buf` holds now, checking each step's promise.
fn drain(
    buf: &mut BytesMut,
    limits: &Limits,
    commands: &mut Vec<Vec<Vec<u8>>>,
) -> Result<Option<End>, TestCaseError> {
    loop {
        let before = buf.len();
        match parse_command(buf, limits) {
            Ok(Some(command)) => {
                prop_assert!(buf.len() < before, "a command consumed nothing");
                prop_assert!(!command.is_empty(), "an empty command was returned");
                commands.push(command.words().map(<[u8]>::to_vec).collect());
            }
            Ok(None) => {
                // Empty lines and arrays are skipped, so only those may be consumed.
                return Ok(None);
            }
            Err(error) => return Ok(Some(End::Error(error))),
        }
    }
}

fn read_whole(input: &[u8], limits: &Limits) -> Result<Read, TestCaseError> {
    let mut buf = BytesMut::from(input);
    let mut commands = Vec::new();
    let end = drain(&mut buf, limits, &mut commands)?.unwrap_or(End::Incomplete(buf.len()));
    Ok(Read { commands, end })
}

fn read_in_pieces(input: &[u8], limits: &Limits, cuts: &[usize]) -> Result<Read, TestCaseError> {
    let mut buf = BytesMut::new();
    let mut commands = Vec::new();
    let mut from = 0;
    for &to in cuts.iter().chain(std::iter::once(&input.len())) {
        buf.extend_from_slice(&input[from..to]);
        from = to;
        if let Some(end) = drain(&mut buf, limits, &mut commands)? {
            return Ok(Read { commands, end });
        }
    }
    Ok(Read {
        commands,
        end: End::Incomplete(buf.len()),
    })
}

#[test]
fn the_command_parser_is_total_and_chunking_invariant() {
    check(2048, stream(), |(input, limits, raw_cuts)| {
        let whole = read_whole(&input, &limits)?;
        let pieces = read_in_pieces(&input, &limits, &cuts(input.len(), &raw_cuts))?;
        prop_assert_eq!(&whole, &pieces, "one piece vs split at {:?}", raw_cuts);
        // Byte by byte, the harshest split.
        let every: Vec<usize> = (0..input.len()).collect();
        prop_assert_eq!(&whole, &read_in_pieces(&input, &limits, &every)?);
        Ok(())
    });
}

#[test]
fn an_incomplete_command_is_left_untouched() {
    check(1024, (argv(), any::<usize>()), |(argv, cut)| {
        let mut encoded = BytesMut::new();
        encode_command(&argv, &mut encoded);
        let cut = cut % encoded.len();
        let mut buf = BytesMut::from(&encoded[..cut]);
        prop_assert_eq!(parse_command(&mut buf, &Limits::default()), Ok(None));
        prop_assert_eq!(&buf[..], &encoded[..cut]);
        Ok(())
    });
}

#[test]
fn encoded_commands_read_back_exactly() {
    let argvs = proptest::collection::vec(argv(), 1..6);
    check(1024, argvs, |argvs| {
        let mut buf = BytesMut::new();
        for argv in &argvs {
            encode_command(argv, &mut buf);
        }
        let wire = buf.clone().freeze();
        let mut at = 0;
        for argv in &argvs {
            let command = parse_command(&mut buf, &Limits::default())
                .map_err(|error| TestCaseError::fail(error.to_string()))?
                .ok_or_else(|| TestCaseError::fail("a whole command read as incomplete"))?;
            let words: Vec<Vec<u8>> = command.words().map(<[u8]>::to_vec).collect();
            prop_assert_eq!(&words, argv);
            let encoded = command.encoded();
            prop_assert_eq!(
                &encoded[..],
                &wire[at..at + encoded.len()],
                "forwarded as sent"
            );
            at += encoded.len();
        }
        prop_assert!(buf.is_empty());
        Ok(())
    });
}
