//! The daily modification budget: how many changes each role may make per UTC day, counted
//! from the audit log under the writers' lock.

use sqlx::{Any, Transaction};

use super::{ChangeError, Role, User};
use crate::time::{day_start, seconds_to_next_day};

/// Modifications a user may make per UTC day, by role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    pub admin: u32,
    pub service: u32,
}

impl Default for Budgets {
    /// Ten a day for an admin; automation gets more, since it applies whole files.
    fn default() -> Self {
        Budgets {
            admin: 10,
            service: 1000,
        }
    }
}

impl Budgets {
    /// A viewer's budget is nothing: it may not write at all.
    fn limit(self, role: Role) -> u32 {
        match role {
            Role::Admin => self.admin,
            Role::Service => self.service,
            Role::Viewer => 0,
        }
    }

    /// Refuses a modification by `user` once today's (UTC) count of its audit rows has reached
    /// its role's budget. `tx` must hold the writers' lock, so that the count includes every
    /// modification committed before this one.
    pub(super) async fn check(
        self,
        tx: &mut Transaction<'static, Any>,
        user: &User,
        now: i64,
    ) -> Result<(), ChangeError> {
        let limit = self.limit(user.role);
        let spent: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM audit_log WHERE actor_id = $1 AND at >= $2")
                .bind(&user.id)
                .bind(day_start(now))
                .fetch_one(&mut **tx)
                .await?;
        if spent >= i64::from(limit) {
            return Err(ChangeError::Budget {
                name: user.name.clone(),
                role: user.role,
                limit,
                retry_after: seconds_to_next_day(now),
            });
        }
        Ok(())
    }
}
