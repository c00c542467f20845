SELECT extract(epoch FROM now() - min(updated_at)) FROM sms_outbox WHERE status IN ('queued', 'sending')
