//! The store's state machine under its one lock: fencing, idempotency, lifecycle
//! transitions, due completions and the List encoding.

use super::*;

impl Inner {
    /// The live slots whose record satisfies `wanted`, in slot order.
    pub(super) fn slots_where(&self, wanted: impl Fn(&Record) -> bool) -> Vec<u32> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, r)| r.as_ref().is_some_and(&wanted))
            .map(|(i, _)| i as u32)
            .collect()
    }

    pub(super) fn rec(&self, slot: u32) -> &Record {
        self.slots[slot as usize]
            .as_ref()
            .unwrap_or_else(|| unreachable!("slot {slot} is live"))
    }

    pub(super) fn rec_mut(&mut self, slot: u32) -> &mut Record {
        self.slots[slot as usize]
            .as_mut()
            .unwrap_or_else(|| unreachable!("slot {slot} is live"))
    }

    pub(super) fn slot_of(&self, id: &str) -> Result<u32, ProviderError> {
        self.index
            .get(id)
            .copied()
            .ok_or_else(|| ProviderError::NotFound { id: id.to_owned() })
    }

    pub(super) fn insert(&mut self, record: Record) -> u32 {
        let slot = self.slots.len() as u32;
        self.counts[record.state as usize] += 1;
        self.index.insert(record.id.clone(), slot);
        self.slots.push(Some(record));
        self.reencode(slot);
        slot
    }

    /// Refreshes the cached wire form of `slot` after a visible change.
    pub(super) fn reencode(&mut self, slot: u32) {
        let len = self.encoded_len(slot);
        let mut framed = Vec::with_capacity(wire::len_field_len(1, len));
        wire::put_len_header(&mut framed, 1, len);
        self.encode_machine(slot, &mut framed);
        debug_assert_eq!(framed.len(), wire::len_field_len(1, len));
        self.rec_mut(slot).framed = framed.into_boxed_slice();
    }

    /// Puts `record` in the place of `slot`'s (same id), as a change: the operation on
    /// record stays (idempotency), queued timers of the old state are dropped.
    pub(super) fn replace(&mut self, slot: u32, mut record: Record) {
        let old = self.rec(slot);
        record.last_op = old.last_op;
        record.generation = old.generation.wrapping_add(1);
        self.counts[old.state as usize] -= 1;
        self.counts[record.state as usize] += 1;
        self.slots[slot as usize] = Some(record);
        self.touch(slot);
    }

    pub(super) fn remove(&mut self, slot: u32) {
        if let Some(rec) = self.slots[slot as usize].take() {
            self.counts[rec.state as usize] -= 1;
            self.index.remove(&rec.id);
            // No log entry (a delta cannot express removal), but the revision moves so a
            // full-List client sees that something changed.
            self.rev += 1;
        }
    }

    /// Records a change of `slot` at a new revision.
    pub(super) fn touch(&mut self, slot: u32) {
        self.reencode(slot);
        self.rev += 1;
        self.log.push((self.rev, slot));
        if self.log.len() > 4 * self.index.len() + 4096 {
            self.compact_log();
        }
    }

    /// Keeps only the newest entry per live slot; a delta only needs "changed after X".
    pub(super) fn compact_log(&mut self) {
        let mut seen = vec![false; self.slots.len()];
        let mut kept: Vec<(u64, u32)> = Vec::with_capacity(self.index.len());
        for &(rev, slot) in self.log.iter().rev() {
            let s = slot as usize;
            if !seen[s] && self.slots[s].is_some() {
                seen[s] = true;
                kept.push((rev, slot));
            }
        }
        kept.reverse();
        self.log = kept;
    }

    pub(super) fn set_state(&mut self, slot: u32, state: MachineState) {
        let old = self.rec(slot).state;
        self.counts[old as usize] -= 1;
        self.counts[state as usize] += 1;
        let rec = self.rec_mut(slot);
        rec.state = state;
        rec.generation = rec.generation.wrapping_add(1);
        rec.awaiting_ready = false;
    }

    pub(super) fn fail(&mut self, slot: u32, reason: &str) {
        self.set_state(slot, MachineState::Failed);
        let rec = self.rec_mut(slot);
        rec.last_error = Some(reason.into());
        rec.doom = None;
        self.touch(slot);
    }

    pub(super) fn peek_due(&self) -> u64 {
        self.due.peek().map_or(u64::MAX, |Reverse((at, ..))| *at)
    }

    pub(super) fn schedule(&mut self, at: u64, slot: u32, kind: DueKind) {
        let generation = self.rec(slot).generation;
        self.due.push(Reverse((at, slot, generation, kind)));
    }

    pub(super) fn process_due(&mut self, now: u64) {
        while let Some(&Reverse((at, slot, generation, kind))) = self.due.peek() {
            if at > now {
                break;
            }
            self.due.pop();
            let live = self.slots[slot as usize]
                .as_ref()
                .is_some_and(|r| r.generation == generation && is_transitional(r.state));
            if !live {
                continue;
            }
            match kind {
                DueKind::Complete => self.complete(slot),
                DueKind::Timeout => {
                    let rec = self.rec(slot);
                    let reason = if rec.awaiting_ready {
                        "node did not become ready before the transition timeout".to_owned()
                    } else {
                        format!("{} timed out", state_name(rec.state))
                    };
                    self.fail(slot, &reason);
                }
            }
        }
    }

    /// Ends the transition `slot` is in: target state, or FAILED when doomed, or still
    /// CONFIGURING when the node has not reported Ready.
    pub(super) fn complete(&mut self, slot: u32) {
        let hold_all = self.config.hold_configuring_until_ready;
        let rec = self.rec_mut(slot);
        let Some(kind) = OpKind::of_transitional(rec.state) else {
            return;
        };
        if let Some(reason) = rec.doom.take() {
            self.fail(slot, &reason);
            return;
        }
        if kind == OpKind::Configure && (hold_all || rec.needs_ready) && !rec.ready {
            if !rec.awaiting_ready {
                rec.awaiting_ready = true;
            }
            return;
        }
        match kind {
            OpKind::Create => rec.host = Host::Own,
            OpKind::Configure => {}
            OpKind::Drain => {
                rec.cluster = None;
                rec.metadata = None;
                rec.ready = false;
            }
            OpKind::Delete => rec.host = Host::None,
        }
        self.set_state(slot, kind.target_state());
        self.touch(slot);
    }

    pub(super) fn mutate(
        &mut self,
        kind: OpKind,
        machine_id: &str,
        token: Token<'_>,
        now: u64,
        apply: impl FnOnce(&mut Record),
        validate: impl FnOnce() -> Result<(), ProviderError>,
    ) -> Result<TransitionAck, ProviderError> {
        // A request without a machine id is malformed whatever its token says: the
        // original's provider kit answers INVALID_ARGUMENT before the fence (issue 18).
        if machine_id.is_empty() {
            return Err(ProviderError::InvalidArgument("machine_id is empty".into()));
        }
        if kind == OpKind::Delete && !self.config.delete_supported {
            return Err(ProviderError::Unsupported { op: kind });
        }
        // Fencing first: a zombie must learn nothing, not even whether the machine exists
        // or which operation id a replay would get.
        if !token.is_zero() {
            let mark = Mark {
                epoch: token.epoch,
                sequence: token.sequence,
            };
            if let Err(stale) = self
                .fences
                .check_and_advance(token.shard_id, machine_id, mark)?
            {
                tracing::warn!(
                    shard = token.shard_id,
                    machine = machine_id,
                    op = %kind,
                    epoch = token.epoch,
                    sequence = token.sequence,
                    hw_epoch = stale.high_water.epoch,
                    hw_sequence = stale.high_water.sequence,
                    "fenced a stale token"
                );
                return Err(ProviderError::Fenced {
                    shard_id: token.shard_id.to_owned(),
                    machine_id: machine_id.to_owned(),
                    epoch: token.epoch,
                    sequence: token.sequence,
                    high_water: stale.high_water,
                });
            }
        }
        validate()?;
        let slot = self.slot_of(machine_id)?;
        let mut doom = None;
        let mut lie = None;
        if let Some(injection) = self.take_injection(machine_id, kind) {
            match injection {
                Injection::Reject { code, message } => {
                    return Err(ProviderError::Injected { code, message });
                }
                Injection::Fail { message } => doom = Some(message),
                ack @ Injection::Ack { .. } => lie = Some(ack),
            }
        }
        let rec = self.rec(slot);
        if let Some((last_kind, op)) = rec.last_op
            && last_kind == kind
            && (rec.state == kind.via_state() || rec.state == kind.target_state())
        {
            // A replay does not start work, so an accept-then-fail (or lying-ack)
            // injection waits for the next real transition.
            if let Some(injection) = doom.map(|message| Injection::Fail { message }).or(lie) {
                self.fail_next
                    .entry((machine_id.into(), kind))
                    .or_default()
                    .push_front(injection);
            }
            self.log_actuation(kind, machine_id, token, op, true);
            return Ok(TransitionAck {
                operation_id: format!("op-{op}"),
                machine: Some(self.to_proto(slot)),
            });
        }
        if rec.state != kind.from_state() {
            return Err(ProviderError::InvalidTransition {
                id: machine_id.to_owned(),
                op: kind,
                state: state_name(rec.state),
            });
        }
        let rate = self.config.failure_rates.get(kind);
        if doom.is_none() && rate > 0.0 && self.rng.random_bool(rate.min(1.0)) {
            let message = format!("injected {kind} failure");
            match self.config.failure_style {
                FailureStyle::Reject => {
                    return Err(ProviderError::Injected {
                        code: tonic::Code::Internal,
                        message,
                    });
                }
                FailureStyle::Fail => doom = Some(message),
            }
        }

        let op = self.next_op;
        self.next_op += 1;
        self.set_state(slot, kind.via_state());
        let rec = self.rec_mut(slot);
        rec.last_op = Some((kind, op));
        rec.last_error = None;
        rec.doom = doom.map(Into::into);
        apply(rec);
        self.touch(slot);

        match self.config.transitions.get(kind) {
            Completion::Instant => self.complete(slot),
            Completion::Staged => {}
            Completion::After(d) => {
                self.schedule(
                    now.saturating_add(d.as_nanos() as u64),
                    slot,
                    DueKind::Complete,
                );
            }
        }
        if let Some(timeout) = self.config.transition_timeout
            && is_transitional(self.rec(slot).state)
        {
            self.schedule(
                now.saturating_add(timeout.as_nanos() as u64),
                slot,
                DueKind::Timeout,
            );
        }
        self.log_actuation(kind, machine_id, token, op, false);
        tracing::debug!(machine = machine_id, op = %kind, operation = op, "accepted");
        let mut machine = self.to_proto(slot);
        if let Some(Injection::Ack { state, last_error }) = lie {
            machine.state = state as i32;
            machine.last_error = last_error;
        }
        Ok(TransitionAck {
            operation_id: format!("op-{op}"),
            machine: Some(machine),
        })
    }

    /// The first injection queued for (machine, operation), if any.
    fn take_injection(&mut self, machine_id: &str, kind: OpKind) -> Option<Injection> {
        if self.fail_next.is_empty() {
            return None;
        }
        let key = (Box::from(machine_id), kind);
        let queue = self.fail_next.get_mut(&key)?;
        let injection = queue.pop_front();
        if queue.is_empty() {
            self.fail_next.remove(&key);
        }
        injection
    }

    /// Appends an accepted call (`replay`: answered from the record, no new work) to the
    /// actuation log, when one is open.
    fn log_actuation(
        &mut self,
        kind: OpKind,
        machine_id: &str,
        token: Token<'_>,
        op: u64,
        replay: bool,
    ) {
        if let Some(log) = &mut self.actuations {
            log.record(
                kind.as_str(),
                machine_id,
                (token.shard_id, token.epoch, token.sequence),
                op,
                replay,
            );
        }
    }

    /// Slots matching `filter` in slot order, and the cursor to hand back.
    pub(super) fn select(&self, filter: &ListFilter) -> (Vec<u32>, Vec<u8>) {
        let mut mask = [filter.states.is_empty(); STATE_SLOTS];
        for &s in &filter.states {
            if let Some(m) = usize::try_from(s).ok().and_then(|i| mask.get_mut(i)) {
                *m = true;
            }
        }
        let wanted = |r: &Record| mask[r.state as usize];
        let cursor = std::str::from_utf8(&filter.since_revision)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .filter(|c| (self.base_rev..=self.rev).contains(c));
        let mut slots: Vec<u32> = match cursor {
            Some(c) => {
                let start = self.log.partition_point(|&(rev, _)| rev <= c);
                let mut changed: Vec<u32> = self.log[start..].iter().map(|&(_, s)| s).collect();
                changed.sort_unstable();
                changed.dedup();
                changed.retain(|&s| self.slots[s as usize].as_ref().is_some_and(wanted));
                changed
            }
            None => self.slots_where(wanted),
        };
        let cap = usize::try_from(filter.max_results).unwrap_or(0);
        let truncated = cap > 0 && slots.len() > cap;
        if truncated {
            slots.truncate(cap);
        }
        // A truncated answer cannot be resumed from the current revision: no cursor.
        let revision = if truncated {
            Vec::new()
        } else {
            self.rev.to_string().into_bytes()
        };
        (slots, revision)
    }

    pub(super) fn to_proto(&self, slot: u32) -> Machine {
        let rec = self.rec(slot);
        let mut m = rec.tpl.statics.clone();
        m.id = rec.id.to_string();
        m.state = rec.state as i32;
        m.host = match &rec.host {
            Host::None => None,
            Host::Own => Some(pb::HostRef {
                provider: self.provider_name.to_string(),
                r#ref: rec.id.to_string(),
            }),
            Host::Custom {
                provider,
                reference,
            } => Some(pb::HostRef {
                provider: provider.to_string(),
                r#ref: reference.to_string(),
            }),
        };
        m.last_error = rec.last_error.as_deref().unwrap_or_default().to_owned();
        m.cluster = rec.cluster.as_deref().unwrap_or_default().to_owned();
        m.shard_metadata = rec.metadata.as_deref().cloned().unwrap_or_default();
        m
    }

    pub(super) fn host_parts<'a>(&'a self, rec: &'a Record) -> Option<(&'a str, &'a str)> {
        match &rec.host {
            Host::None => None,
            Host::Own => Some((&self.provider_name, &rec.id)),
            Host::Custom {
                provider,
                reference,
            } => Some((provider, reference)),
        }
    }

    pub(super) fn encoded_len(&self, slot: u32) -> usize {
        let rec = self.rec(slot);
        let mut n = wire::str_len(1, rec.id.as_bytes()) + wire::enum_len(2, rec.state as i32);
        if let Some((provider, reference)) = self.host_parts(rec) {
            let inner =
                wire::str_len(1, provider.as_bytes()) + wire::str_len(2, reference.as_bytes());
            n += wire::len_field_len(3, inner);
        }
        n += rec.tpl.encoded.len();
        n += wire::str_len(12, rec.last_error.as_deref().unwrap_or_default().as_bytes());
        n += wire::str_len(14, rec.cluster.as_deref().unwrap_or_default().as_bytes());
        if let Some(md) = &rec.metadata {
            n += wire::map_len(15, md.iter());
        }
        n
    }

    pub(super) fn encode_machine(&self, slot: u32, buf: &mut impl BufMut) {
        let rec = self.rec(slot);
        wire::put_str(buf, 1, rec.id.as_bytes());
        wire::put_enum(buf, 2, rec.state as i32);
        if let Some((provider, reference)) = self.host_parts(rec) {
            let inner =
                wire::str_len(1, provider.as_bytes()) + wire::str_len(2, reference.as_bytes());
            wire::put_len_header(buf, 3, inner);
            wire::put_str(buf, 1, provider.as_bytes());
            wire::put_str(buf, 2, reference.as_bytes());
        }
        buf.put_slice(&rec.tpl.encoded);
        wire::put_str(
            buf,
            12,
            rec.last_error.as_deref().unwrap_or_default().as_bytes(),
        );
        wire::put_str(
            buf,
            14,
            rec.cluster.as_deref().unwrap_or_default().as_bytes(),
        );
        if let Some(md) = &rec.metadata {
            wire::put_map(buf, 15, md.iter());
        }
    }
}
