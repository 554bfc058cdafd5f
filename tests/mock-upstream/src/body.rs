//! The response body: either one frame, or a scripted list of frames that can be paced by a
//! timer and end with a deliberate error (which makes hyper drop the connection mid-body).

use std::collections::VecDeque;
use std::fmt;
use std::future::Future as _;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{sleep_until, Instant, Sleep};

/// How long a cut body waits after its last frame before failing, so that hyper flushes the
/// bytes it has buffered to the socket before it drops the connection.
const ABORT_GRACE: Duration = Duration::from_millis(10);

pub(crate) struct MockBody {
    inner: Inner,
}

enum Inner {
    /// One frame. `exact`: announce its length (`content-length`), else use chunked encoding.
    Full {
        data: Option<Bytes>,
        exact: bool,
    },
    Scripted(Box<Scripted>),
    /// `head`, then `chunk` again and again, never ending (until the peer goes away).
    Endless {
        head: Option<Bytes>,
        chunk: Bytes,
        /// Every other poll is `Pending` (after waking itself): hyper flushes what it
        /// buffered only when the body is not ready, so an always-ready body is never sent.
        ready: bool,
    },
}

struct Scripted {
    frames: VecDeque<Bytes>,
    /// Pause between two frames (zero: none).
    delay: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    waiting: bool,
    abort: Abort,
    exact_len: Option<u64>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Abort {
    Never,
    /// After the last frame: arm the grace timer.
    AfterFrames,
    /// The grace timer has run: fail.
    Now,
}

impl MockBody {
    pub(crate) fn full(data: Bytes, exact: bool) -> MockBody {
        MockBody {
            inner: Inner::Full {
                data: (!data.is_empty()).then_some(data),
                exact,
            },
        }
    }

    /// `frames` in order, `delay` between two of them, then the end of the body — or, with
    /// `abort`, an error that aborts the connection. `exact_len` is announced as the
    /// `content-length` (even if the frames do not add up to it).
    pub(crate) fn scripted(
        frames: Vec<Bytes>,
        delay: Duration,
        abort: bool,
        exact_len: Option<u64>,
    ) -> MockBody {
        MockBody {
            inner: Inner::Scripted(Box::new(Scripted {
                frames: frames.into_iter().filter(|f| !f.is_empty()).collect(),
                delay,
                timer: None,
                waiting: false,
                abort: if abort {
                    Abort::AfterFrames
                } else {
                    Abort::Never
                },
                exact_len,
            })),
        }
    }
}

impl MockBody {
    /// `head`, then `chunk` forever: a body that never ends.
    pub(crate) fn endless(head: Bytes, chunk: Bytes) -> MockBody {
        MockBody {
            inner: Inner::Endless {
                head: (!head.is_empty()).then_some(head),
                chunk,
                ready: true,
            },
        }
    }
}

impl Scripted {
    fn arm(&mut self, after: Duration) {
        let deadline = Instant::now() + after;
        match &mut self.timer {
            Some(timer) => timer.as_mut().reset(deadline),
            None => self.timer = Some(Box::pin(sleep_until(deadline))),
        }
        self.waiting = true;
    }

    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Aborted>>> {
        loop {
            if self.waiting {
                if let Some(timer) = &mut self.timer {
                    ready!(timer.as_mut().poll(cx));
                }
                self.waiting = false;
            }
            if let Some(frame) = self.frames.pop_front() {
                if !self.delay.is_zero() && !self.frames.is_empty() {
                    self.arm(self.delay);
                }
                return Poll::Ready(Some(Ok(Frame::data(frame))));
            }
            match self.abort {
                Abort::Never => return Poll::Ready(None),
                Abort::AfterFrames => {
                    self.abort = Abort::Now;
                    self.arm(ABORT_GRACE);
                }
                Abort::Now => return Poll::Ready(Some(Err(Aborted))),
            }
        }
    }
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = Aborted;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Aborted>>> {
        match &mut self.get_mut().inner {
            Inner::Full { data, .. } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Inner::Scripted(s) => s.poll_frame(cx),
            Inner::Endless { head, chunk, ready } => {
                *ready = !*ready;
                if *ready {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Poll::Ready(Some(Ok(Frame::data(
                    head.take().unwrap_or_else(|| chunk.clone()),
                ))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Full { data, .. } => data.is_none(),
            Inner::Scripted(s) => s.frames.is_empty() && s.abort == Abort::Never && !s.waiting,
            Inner::Endless { .. } => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Full {
                data: Some(data),
                exact: true,
            } => SizeHint::with_exact(data.len() as u64),
            Inner::Full { data: None, .. } => SizeHint::with_exact(0),
            Inner::Full { .. } => SizeHint::new(),
            Inner::Scripted(s) => s.exact_len.map_or_else(SizeHint::new, SizeHint::with_exact),
            Inner::Endless { .. } => SizeHint::new(),
        }
    }
}

/// The error a cut body ends with; hyper drops the connection when it sees it.
#[derive(Debug)]
pub(crate) struct Aborted;

impl fmt::Display for Aborted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("mock-upstream: response cut on purpose (x-mock-cut-after)")
    }
}

impl std::error::Error for Aborted {}
