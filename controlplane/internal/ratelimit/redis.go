package ratelimit

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis shares counters across replicas.
type Redis struct {
	Client *redis.Client
	Prefix string
}

// Hit increments the window's counter and lets it expire after the window ends.
func (s *Redis) Hit(ctx context.Context, key string, window time.Time) (int64, error) {
	k := s.Prefix + "ratelimit:" + key + ":" + strconv.FormatInt(window.Unix(), 10)
	pipe := s.Client.Pipeline()
	incr := pipe.Incr(ctx, k)
	pipe.ExpireNX(ctx, k, 2*time.Minute)
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, err
	}
	return incr.Val(), nil
}
